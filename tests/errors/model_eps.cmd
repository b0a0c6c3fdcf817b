tests/errors/model_eps.lua
