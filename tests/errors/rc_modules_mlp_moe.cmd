tiny_moe --recompute selective --recompute-modules mlp
