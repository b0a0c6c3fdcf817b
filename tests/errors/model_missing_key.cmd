tests/errors/model_missing_key.lua
