-- no vocabulary padding multiple: Megatron pads the vocabulary to a multiple of vocab_pad*TP
return gpt {
    layers = 2,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 97,
    vocab_pad = 0,
}
