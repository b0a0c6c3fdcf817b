-- GPT-2 774M (Radford et al. 2019; Hugging Face config): 36 layers, hidden 1280,
-- 20 heads, context 1024, BPE vocabulary of 50257 tokens.
return gpt {
    description = "GPT-2 774M",
    layers  = 36,
    hidden  = 1280,
    heads   = 20,
    seq_len = 1024,
    vocab   = 50257,
}
