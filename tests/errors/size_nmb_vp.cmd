tiny --pp 2 --vp 2 --nmb 3
