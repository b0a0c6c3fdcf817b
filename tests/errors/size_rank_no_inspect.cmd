tiny --rank 0
