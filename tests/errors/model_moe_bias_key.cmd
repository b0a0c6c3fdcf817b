tests/errors/model_moe_bias_key.lua
