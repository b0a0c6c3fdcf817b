tests/errors/model_too_large.lua
