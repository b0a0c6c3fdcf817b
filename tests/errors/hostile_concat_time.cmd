tests/errors/hostile_concat_time.lua
