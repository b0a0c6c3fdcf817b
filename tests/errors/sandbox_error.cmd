tests/errors/sandbox_error.lua
