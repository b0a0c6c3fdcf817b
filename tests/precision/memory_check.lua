-- tests/precision/memory_check.lua: every stage of a memory plan (build/gen --dump memory)
-- within a limit, on the CPU and on the GPU.
-- Run: build/gen --lua tests/precision/memory_check.lua MEMORY.json LIMIT_BYTES
-- Prints "ok: largest stage S, CPU X GiB, GPU Y GiB" or what is over (and exits 1).
local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
local T = require("harness")("memory")

local f = assert(io.open(arg[1], "rb"))
local stages = T.json(f:read("a"))
f:close()
local limit = tonumber(arg[2])
local function get(obj, key) return obj.map[key] end
local GiB = 1024.0 ^ 3
local worst, over = nil, {}
for _, s in ipairs(stages) do
    local cpu, gpu = get(s, "peak_bytes"), get(get(s, "cuda"), "peak_bytes")
    if not worst or gpu > worst.gpu then worst = { stage = get(s, "stage"), cpu = cpu, gpu = gpu } end
    if cpu > limit or gpu > limit then
        over[#over + 1] = string.format("stage %d: CPU %.2f GiB, GPU %.2f GiB", get(s, "stage"),
                                        cpu / GiB, gpu / GiB)
    end
end
if #stages == 0 then print("no stages in " .. arg[1]); os.exit(1) end
if #over > 0 then
    print(string.format("over %.2f GiB: %s", limit / GiB, table.concat(over, "; ")))
    os.exit(1)
end
print(string.format("ok: largest stage %d, CPU %.2f GiB, GPU %.2f GiB", worst.stage,
                    worst.cpu / GiB, worst.gpu / GiB))
