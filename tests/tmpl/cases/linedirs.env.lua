return { items = { "b", "c" }, on = true, title = "t" }, { line_dirs = true }
