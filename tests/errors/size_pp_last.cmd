tiny_moe --tp 2 --pp 2 --dp 4 --ep 2 --order tp-ep-pp-dp
