tiny_moe --tp 2 --ep 2 --etp 1 --check
