tiny --recompute full --recompute-layers 2
