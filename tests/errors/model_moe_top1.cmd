tests/errors/model_moe_top1.lua
