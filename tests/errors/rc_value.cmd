tiny --recompute partial
