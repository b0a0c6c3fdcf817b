tests/errors/dup_key.lua
