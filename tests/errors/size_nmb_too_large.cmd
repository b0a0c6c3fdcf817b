tiny --pp 2 --nmb 4097
