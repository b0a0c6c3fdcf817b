-- GPT-2 124M (Radford et al. 2019; Hugging Face config): 12 layers, hidden 768,
-- 12 heads, context 1024, BPE vocabulary of 50257 tokens.
return gpt {
    description = "GPT-2 124M",
    layers  = 12,
    hidden  = 768,
    heads   = 12,
    seq_len = 1024,
    vocab   = 50257,
}
