-- tiny_v128_t192: models/tiny.lua with vocab 128 and seq_len 192, for tests/faults: its
-- parameters have tiny's count to the byte (128*64 + 192*64 = 256*64 + 64*64: wte's rows
-- become wpe's), so only the model text a resume checkpoint records tells the two apart.
return gpt {
    description = "tiny GPT, checkpoint-sized as tiny, another model",
    layers  = 8,
    hidden  = 64,
    heads   = 4,
    seq_len = 192,
    vocab   = 128,
}
