tiny --ep 2 --dp 2
