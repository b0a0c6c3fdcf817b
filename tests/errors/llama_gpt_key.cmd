tests/errors/llama_gpt_key.lua 
