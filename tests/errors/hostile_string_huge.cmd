tests/errors/hostile_string_huge.lua
