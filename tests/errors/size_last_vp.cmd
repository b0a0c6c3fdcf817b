gpt2_124m --pp 3 --vp 2 --first-layers 2 --last-layers 3 --nmb 3
