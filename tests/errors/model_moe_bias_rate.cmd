tests/errors/model_moe_bias_rate.lua
