gpt2_124m --pp 4 --recompute full --recompute-method block --recompute-layers 4
