tiny --recompute selective --recompute-method uniform
