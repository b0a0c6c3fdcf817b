tiny --pp 2 --nmb 4 --microbatch-group 2
