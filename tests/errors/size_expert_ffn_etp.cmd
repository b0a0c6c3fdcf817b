tiny_moe --etp 3 --dp 3
