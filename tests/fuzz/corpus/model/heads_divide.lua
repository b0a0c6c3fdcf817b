-- tiny: a small GPT for tests and the CPU demo: 8 layers (so PP=4 with VP=2 divides them),
-- hidden 64, 4 heads of 16, context 64, byte vocabulary (256 tokens: no tokenizer needed).
return gpt {
    description = "tiny GPT for tests",
    layers  = 8,
    hidden  = 64,
    heads   = 5,
    seq_len = 64,
    vocab   = 256,
}
