tests/models/moe_cap.lua --cp 2
