tests/errors/hostile_eps_inf.lua
