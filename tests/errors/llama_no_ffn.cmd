tests/errors/llama_no_ffn.lua 
