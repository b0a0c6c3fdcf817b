-- errors.env.lua: the environment of every err_*.tmpl case.
return {
    name = "gpt2", n = 4, eps = 1e-5, flag = true,
    cfg = { C = 768, inner = { x = 1 } },
    items = { "a", "b" },
    map = { a = 1, b = 2 },
    holes = { 1, nil, 3 },
}
