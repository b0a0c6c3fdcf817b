tests/errors/size_ffn_tp.lua --tp 4
