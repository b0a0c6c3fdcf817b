return {
    x = "outer",
    cuda = false, mode_a = false, mode_b = true,
    stages = {
        { id = 0, ops = { { name = "attn", fwd = true, comm = false },
                          { name = "mlp", fwd = false, comm = false } } },
        { id = 1, ops = { { name = "send", fwd = false, comm = true } } },
        { id = 2, ops = {} },
    },
}
