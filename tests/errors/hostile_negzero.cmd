tests/errors/hostile_negzero.lua
