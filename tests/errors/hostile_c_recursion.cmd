tests/errors/hostile_c_recursion.lua
