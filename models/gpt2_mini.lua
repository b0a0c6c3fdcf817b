-- gpt2_mini: GPT-2's architecture and BPE vocabulary (50257 tokens: GPT-2's tokenizer.json),
-- small enough to train on a CPU in minutes: 4 layers, hidden 128, 4 heads, context 128. The
-- model of README's walk-through (text folder -> tokenizer -> training -> generation -> export).
return gpt {
    description = "GPT-2 vocabulary, 4 small layers",
    layers  = 4,
    hidden  = 128,
    heads   = 4,
    seq_len = 128,
    vocab   = 50257,
}
