tests/errors/dup_key_local.lua
