tiny --pp 2 --layout t*4|t*4L
