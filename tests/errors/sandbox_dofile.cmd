tests/errors/sandbox_dofile.lua
