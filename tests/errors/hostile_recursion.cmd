tests/errors/hostile_recursion.lua
