tiny --pp 2 --vp 2 --nmb 5 --microbatch-group 4
