tests/errors/model_moe_plain.lua
