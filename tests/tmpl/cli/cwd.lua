-- cwd.lua: renders a template by its root-relative path whatever the current directory.
local env = dofile(require("host").root() .. "/tests/tmpl/cases/include.env.lua")
io.write(require("tmpl").render("tests/tmpl/cases/include.tmpl", env))
