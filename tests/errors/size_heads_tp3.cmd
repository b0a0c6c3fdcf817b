tiny --tp 3
