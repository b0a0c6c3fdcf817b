return { on = true, list = { "a", "b" } }
