tests/errors/model_positional.lua
