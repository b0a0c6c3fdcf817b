tests/errors/hostile_inf.lua
