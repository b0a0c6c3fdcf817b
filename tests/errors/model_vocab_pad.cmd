tests/errors/model_vocab_pad.lua --tp 2
