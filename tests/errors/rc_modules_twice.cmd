tiny --recompute selective --recompute-modules mlp,mlp
