tests/errors/hostile_1e308.lua
