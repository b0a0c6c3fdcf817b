tests/errors/dup_key_moe.lua
