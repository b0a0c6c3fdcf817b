tiny --recompute selective --recompute-modules core_attn,ffn
