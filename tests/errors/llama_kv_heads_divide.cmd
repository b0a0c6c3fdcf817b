tests/errors/llama_kv_heads_divide.lua 
