tests/errors/model_moe_aux.lua
