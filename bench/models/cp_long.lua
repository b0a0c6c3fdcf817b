-- cp_long: the long-sequence model of bench/cp_bench.sh (not a test model): tiny's width
-- (hidden 64, 4 heads of 16) and byte vocabulary with a context of 8192 positions, 4 layers.
-- Its activations grow with the sequence while its parameters stay small, so the memory plan
-- shows what context parallelism divides; small enough that a CPU trains a step in seconds.
return gpt {
    description = "long-context GPT for the context-parallel CPU benchmark",
    layers  = 4,
    hidden  = 64,
    heads   = 4,
    seq_len = 8192,
    vocab   = 256,
}
