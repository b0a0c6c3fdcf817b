gpt2_124m --pp 4 --vp 2 --first-layers 3 --last-layers 3 --nmb 4
