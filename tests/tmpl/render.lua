-- tests/tmpl/render.lua: renders one template for suite.sh (run: build/gen --lua THIS ...).
--   build/gen --lua tests/tmpl/render.lua TEMPLATE [ENV.lua [source]]
-- ENV.lua returns the environment table and, optionally, the render options. With "source",
-- prints tmpl.lua_source(TEMPLATE) instead of rendering. Errors go to the host's reporter.
local tmpl = require("tmpl")
local path, envfile, mode = arg[1], arg[2], arg[3]
if mode == "source" then
    io.write(tmpl.lua_source(path))
    return
end
local env, options = {}, nil
if envfile and envfile ~= "" then
    env, options = dofile(envfile)
end
io.write(tmpl.render(path, env, options))
