-- odd: a test model whose sizes divide almost nothing evenly (tests/parallel). Hidden 35 =
-- 5 heads of 7 (TP 1 or 5); a 97-token vocabulary, padded only to a multiple of TP (vocab_pad
-- 1; TP 5: 100 rows, 20 per rank, the last rank holds 17 real rows and 3 of padding);
-- context 30 (divisible by 5 for SP). The model has 35 * 995 = 34,825 parameters: odd and not
-- divisible by 3, so no data-parallel size 2, 3 or 4 divides the gradient buffer.
return gpt {
    description = "odd-sized GPT for the parallel tests",
    layers    = 2,
    hidden    = 35,
    heads     = 5,
    seq_len   = 30,
    vocab     = 97,
    vocab_pad = 1,
}
