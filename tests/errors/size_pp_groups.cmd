tiny_moe --tp 2 --pp 2 --dp 2 --ep 2 --etp 1 --order tp-cp-pp-ep-dp
