tests/errors/model_type.lua
