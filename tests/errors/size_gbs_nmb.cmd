tiny --dp 2 --mbs 2 --gbs 12 --nmb 2
