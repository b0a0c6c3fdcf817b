tests/errors/sandbox_require.lua
