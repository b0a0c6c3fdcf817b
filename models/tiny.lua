-- tiny: a small GPT for tests and the CPU demo: 4 layers, hidden 64, 4 heads of 16,
-- context 64, byte vocabulary (256 tokens: no tokenizer needed).
return gpt {
    description = "tiny GPT for tests",
    layers  = 4,
    hidden  = 64,
    heads   = 4,
    seq_len = 64,
    vocab   = 256,
}
