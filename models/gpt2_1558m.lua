-- GPT-2 1558M (Radford et al. 2019; Hugging Face config): 48 layers, hidden 1600,
-- 25 heads, context 1024, BPE vocabulary of 50257 tokens.
return gpt {
    description = "GPT-2 1558M",
    layers  = 48,
    hidden  = 1600,
    heads   = 25,
    seq_len = 1024,
    vocab   = 50257,
}
