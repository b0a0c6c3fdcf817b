tiny --pp 2 --first-layers 1 --last-layers 1
