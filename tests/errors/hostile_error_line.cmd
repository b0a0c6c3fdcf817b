tests/errors/hostile_error_line.lua
