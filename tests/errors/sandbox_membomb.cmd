tests/errors/sandbox_membomb.lua
