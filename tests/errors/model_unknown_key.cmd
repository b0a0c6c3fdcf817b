tests/errors/model_unknown_key.lua
