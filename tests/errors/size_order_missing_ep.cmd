tiny_moe --ep 2 --dp 2 --order tp-cp-dp-pp
