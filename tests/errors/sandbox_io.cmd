tests/errors/sandbox_io.lua
