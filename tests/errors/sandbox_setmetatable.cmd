tests/errors/sandbox_setmetatable.lua
