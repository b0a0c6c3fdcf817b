tests/errors/hostile_error_long.lua
