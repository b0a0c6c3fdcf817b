tiny --recompute full --recompute-method uniform --recompute-layers 1 --recompute-modules mlp
