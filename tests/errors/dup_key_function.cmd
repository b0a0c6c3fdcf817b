tests/errors/dup_key_function.lua
