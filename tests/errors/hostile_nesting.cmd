tests/errors/hostile_nesting.lua
