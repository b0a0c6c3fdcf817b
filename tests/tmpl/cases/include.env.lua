return {
    title = "model",
    layers = { { idx = 0, name = "first", sub = { kind = "dense" } },
               { idx = 1, name = "second", sub = { kind = "moe" } } },
}
