tests/errors/size_moe_bias_etp.lua --etp 2 --dp 2
