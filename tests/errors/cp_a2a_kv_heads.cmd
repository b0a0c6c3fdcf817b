tiny_llama --tp 2 --cp 4 --cp-comm a2a
