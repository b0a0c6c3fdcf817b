tests/errors/llama_rope_odd.lua 
