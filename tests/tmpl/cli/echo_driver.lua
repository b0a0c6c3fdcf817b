-- echo_driver.lua: a stand-in for gen/lua/driver.lua (run: build/gen --driver THIS ...).
-- Prints the opts table main.c built, one "key = value (type)" per line in sorted order.
-- MODEL "user-error" raises a located user error, as the real passes do.
local M = {}

function M.run(opts)
    if opts.model == "user-error" then
        error({ file = "models/tiny.lua", line = 7,
                 msg = "'n_head' (12) must divide 'channels' (100)" }, 0)
    end
    local keys = {}
    for k in pairs(opts) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do
        local v = opts[k]
        local kind = math.type(v) or type(v)
        print(("%s = %s (%s)"):format(k, tostring(v), kind))
    end
end

return M
