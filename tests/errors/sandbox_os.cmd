tests/errors/sandbox_os.lua
