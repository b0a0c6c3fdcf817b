tests/errors/sandbox_debug.lua
