tiny --pp 2 --layout E|t*4|x*4L
