tiny --pp 4 --account-embedding --account-loss --nmb 4
