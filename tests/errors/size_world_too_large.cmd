tiny --tp 2 --dp 1048576
