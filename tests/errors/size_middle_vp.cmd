gpt2_124m --pp 4 --vp 2 --first-layers 2 --last-layers 4 --nmb 4
