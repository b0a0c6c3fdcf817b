tiny --recompute selective --recompute-modules moe_act
