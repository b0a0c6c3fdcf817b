tiny --recompute full --recompute-method uniform
