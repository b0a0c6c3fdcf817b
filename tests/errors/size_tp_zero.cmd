tiny --tp 0
