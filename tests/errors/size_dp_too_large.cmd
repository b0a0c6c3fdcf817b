tiny --dp 2000000
