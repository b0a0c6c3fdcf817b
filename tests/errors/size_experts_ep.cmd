tiny_moe --ep 3 --dp 3
