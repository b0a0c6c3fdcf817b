tiny --pp 2 --vp 2 --nmb 4 --microbatch-group 0
