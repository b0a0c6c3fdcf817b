tiny --recompute full --recompute-method uniform --recompute-layers 0
