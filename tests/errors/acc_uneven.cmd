tiny --pp 2 --first-layers 3 --account-embedding
