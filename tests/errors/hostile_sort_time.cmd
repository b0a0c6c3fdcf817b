tests/errors/hostile_sort_time.lua
