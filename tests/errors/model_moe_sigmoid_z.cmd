tests/errors/model_moe_sigmoid_z.lua
