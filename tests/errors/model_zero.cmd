tests/errors/model_zero.lua
