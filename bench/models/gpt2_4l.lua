-- gpt2_4l: GPT-2 124M's shapes with 4 of its 12 layers, for bench/train_bench.sh (our CPU
-- program against PyTorch on the CPU): hidden 768, 12 heads of 64, vocabulary 50257 (padded
-- to 50304 as Megatron pads it), context 1024 (the benchmark trains at --seq 64 and 256).
return gpt {
    description = "GPT-2 124M shapes, 4 layers (benchmark)",
    layers  = 4,
    hidden  = 768,
    heads   = 12,
    seq_len = 1024,
    vocab   = 50257,
}
