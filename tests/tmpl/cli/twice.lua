-- twice.lua: renders and compiles one template several times; its unused needs: warning
-- must appear once (templates are compiled once per path and cached).
local tmpl = require("tmpl")
local path = "tests/tmpl/cases/err_needs.tmpl"
local env = { name = "n", cfg = { C = 1 } }
local a = tmpl.render(path, env)
local b = tmpl.compile(path)(env)
local c = tmpl.render(path, env)
assert(a == b and b == c, "renders differ")
io.write(a)
