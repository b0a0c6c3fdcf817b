tests/errors/size_shared_expert_tp.lua --tp 4 --ep 2 --etp 2 --sp --dp 2
