tiny --pp 4 --vp 2 --nmb 8 --microbatch-group 3
