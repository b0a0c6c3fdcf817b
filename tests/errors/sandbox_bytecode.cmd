build/test/errors/sandbox_bytecode.lua
