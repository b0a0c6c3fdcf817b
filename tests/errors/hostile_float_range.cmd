tests/errors/hostile_float_range.lua
