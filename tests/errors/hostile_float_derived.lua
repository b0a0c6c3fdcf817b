-- A coefficient the model accepts, but whose derived per-token scale underflows a float.
return gpt { layers = 2, hidden = 64, heads = 4, seq_len = 64, vocab = 256, add_bias_linear = false,
  moe = moe { experts = 4, top_k = 2, aux_loss_coeff = 1e-37 } }
