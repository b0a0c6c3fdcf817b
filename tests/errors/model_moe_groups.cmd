tests/errors/model_moe_groups.lua
