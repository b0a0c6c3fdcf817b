tests/errors/hostile_fields.lua
