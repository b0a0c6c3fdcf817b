-- tests/program/json_check.lua: a --dump file is well-formed JSON holding the pass's record
-- (read with the test harness's JSON reader). Run: build/gen --lua json_check.lua FILE PASS
local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
local T = require("harness")("dump")
local f = assert(io.open(arg[1], "rb"))
local text = f:read("a")
f:close()
local v = T.json(text)
local want = { schedule = { "kind", "P", "V", "M", "N", "stages" },
               program = { "model", "layout", "model_text", "layout_text", "made_by",
                           "schedule_kind", "consts", "roles", "dense", "expert", "groups",
                           "stages", "layer" } }
local keys = table.concat(v.keys, ",")
if keys ~= table.concat(want[arg[2]], ",") then
    print("keys " .. keys)
    os.exit(1)
end
print("ok")
