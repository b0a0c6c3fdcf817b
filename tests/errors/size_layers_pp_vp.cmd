tiny --pp 2 --vp 8 --nmb 2
