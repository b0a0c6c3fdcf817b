tests/errors/dup_none.lua
