-- GPT-3 175B (Brown et al. 2020, table 2.1: "GPT-3 175B"): 96 layers, d_model 12288,
-- 96 heads of 128, context 2048, the GPT-2 BPE vocabulary (50257 tokens).
return gpt {
    description = "GPT-3 175B",
    layers  = 96,
    hidden  = 12288,
    heads   = 96,
    seq_len = 2048,
    vocab   = 50257,
}
