tests/errors/model_moe_bool.lua
