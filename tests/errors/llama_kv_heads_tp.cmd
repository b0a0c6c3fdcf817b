tests/errors/llama_kv_heads_tp.lua --tp 4
