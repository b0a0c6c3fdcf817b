tiny --pp 2 --vp 4 --nmb 2
