tests/errors/llama_tie_type.lua 
