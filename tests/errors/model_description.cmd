tests/errors/model_description.lua
