tests/errors/hostile_eps_nan.lua
