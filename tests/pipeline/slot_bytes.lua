-- tests/pipeline/slot_bytes.lua: what make inspect counts for one activation slot of a
-- one-layer chunk without the embedding (inspect.slot_bytes), for the layout given as gen
-- arguments. Run: build/gen --lua tests/pipeline/slot_bytes.lua tiny --tp 2 --sp ...
local config = require("config")
local inspect = require("inspect")

local opts = {}
local i = 1
while i <= #arg do
    local a = arg[i]
    local name = a:match("^%-%-(.+)$")
    if not name then
        opts.model = a
    elseif arg[i + 1] and arg[i + 1]:match("^%d+$") then
        opts[name:gsub("%-", "_")] = math.tointeger(tonumber(arg[i + 1]))
        i = i + 1
    else
        opts[name:gsub("%-", "_")] = true
    end
    i = i + 1
end
print(inspect.slot_bytes(config.load(opts), { count = 1, embedding = false }))
