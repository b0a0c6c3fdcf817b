tiny --recompute selective --recompute-layers 2
