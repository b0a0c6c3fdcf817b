return {
    name = "gpt2", count = 12, neg = -3, big = 9007199254740993,
    cfg = { dims = { 768, 3072 }, dtype = "bf16", inner = { deep = { { v = "d1" } } },
            ["end"] = "kw" },
    unicode = "Grüße ✓",
}
