tests/errors/dup_key_bracket.lua
