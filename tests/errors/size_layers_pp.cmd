tiny --pp 3
