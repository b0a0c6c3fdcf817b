tiny --recompute-method uniform
