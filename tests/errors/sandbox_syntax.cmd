tests/errors/sandbox_syntax.lua
