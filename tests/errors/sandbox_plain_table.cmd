tests/errors/sandbox_plain_table.lua
