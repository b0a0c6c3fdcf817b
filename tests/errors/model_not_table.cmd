tests/errors/model_not_table.lua
