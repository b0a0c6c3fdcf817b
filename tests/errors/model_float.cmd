tests/errors/model_float.lua
