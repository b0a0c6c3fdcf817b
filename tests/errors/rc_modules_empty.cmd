tiny --recompute selective --recompute-modules core_attn,,mlp
