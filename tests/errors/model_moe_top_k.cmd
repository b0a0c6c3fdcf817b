tests/errors/model_moe_top_k.lua
