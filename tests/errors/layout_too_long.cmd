tiny --pp 2 --layout E|t*99999999|L
