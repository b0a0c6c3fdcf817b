tests/errors/sandbox_no_return.lua
