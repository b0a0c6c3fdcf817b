tests/errors/model_moe_pad_no_cap.lua
