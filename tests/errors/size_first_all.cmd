tiny --pp 2 --first-layers 8
