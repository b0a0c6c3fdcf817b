-- tests/llama/gqa4_llama.lua: tiny_llama with 8 query heads on 2 kv heads (groups of 4): at
-- TP 2 one kv head per rank serves 4 query heads, which the compact K/V layout, the CP ring's
-- K|V blocks and the all-to-all's head groups must map (docs/llama.md §3).
return llama {
    description = "tiny Llama, 8 query heads on 2 kv heads",
    layers         = 8,
    hidden         = 64,
    heads          = 8,
    kv_heads       = 2,
    ffn_hidden     = 128,
    seq_len        = 64,
    vocab          = 256,
}
