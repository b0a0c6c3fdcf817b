tiny --tp 2 --pp 2 --inspect --rank 4
