tests/errors/hostile_table_move.lua
