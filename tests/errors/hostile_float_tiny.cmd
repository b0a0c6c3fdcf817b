tests/errors/hostile_float_tiny.lua
