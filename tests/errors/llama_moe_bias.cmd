tests/errors/llama_moe_bias.lua 
