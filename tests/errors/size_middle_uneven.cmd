gpt2_124m --pp 4 --first-layers 3 --last-layers 4
