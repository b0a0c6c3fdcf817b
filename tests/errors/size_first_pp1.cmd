tiny --first-layers 2
