tests/errors/hostile_nan.lua
