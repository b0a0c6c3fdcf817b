-- bench/plan_predict.lua: the planner's predicted step of one layout (gen/lua/plan.lua), for
-- bench/plan_bench.sh:  build/gen --lua bench/plan_predict.lua GFLOPS,GBS CORES MODEL [--tp 2 ...]
-- Prints "predict MS PEAK_BYTES".
package.path = "gen/lua/?.lua;" .. package.path
local config = require("config")
local plan = require("plan")
local rates, cores, model = arg[1], tonumber(arg[2]), arg[3]
local opts = { model = model }
local i = 4
while arg[i] do
    local k = arg[i]:gsub("^%-%-", ""):gsub("-", "_")
    local v = arg[i + 1]
    if v == nil or v:match("^%-%-") then opts[k], i = true, i + 1
    else opts[k], i = tonumber(v) or v, i + 2 end
end
local cfg = config.load(opts)
local dev = plan.device({ gpu = "cpu", gpu_mem = "1000", cpu_rates = rates, cores = cores })
local rec, why = plan.evaluate(cfg, dev, cfg.world)
if not rec then io.stderr:write("plan_predict: ", why, "\n") os.exit(1) end
print(string.format("predict %.3f %d", rec.step * 1e3, rec.peak))
