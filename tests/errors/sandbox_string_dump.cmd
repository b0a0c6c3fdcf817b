tests/errors/sandbox_string_dump.lua
