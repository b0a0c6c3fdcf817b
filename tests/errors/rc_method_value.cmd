tiny --recompute full --recompute-method even --recompute-layers 1
