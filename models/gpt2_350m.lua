-- GPT-2 350M (Radford et al. 2019; Hugging Face config): 24 layers, hidden 1024,
-- 16 heads, context 1024, BPE vocabulary of 50257 tokens.
return gpt {
    description = "GPT-2 350M",
    layers  = 24,
    hidden  = 1024,
    heads   = 16,
    seq_len = 1024,
    vocab   = 50257,
}
