tests/errors/hostile_env_table.lua
