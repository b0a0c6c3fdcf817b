tiny --tp 2 --dp 2 --cp 2
