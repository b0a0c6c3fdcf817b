tests/errors/model_heads_hidden.lua
