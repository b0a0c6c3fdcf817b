tests/errors/sandbox_loop.lua
