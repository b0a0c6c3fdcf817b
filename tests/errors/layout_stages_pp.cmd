tiny --pp 3 --layout E|t*8|L|
