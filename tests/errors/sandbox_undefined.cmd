tests/errors/sandbox_undefined.lua
