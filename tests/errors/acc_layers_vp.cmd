tiny --pp 3 --vp 2 --account-loss --nmb 6
