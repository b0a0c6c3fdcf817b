tests/errors/sandbox_load.lua
