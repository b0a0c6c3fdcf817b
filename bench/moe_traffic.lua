-- bench/moe_traffic.lua: the analytic all-to-all volume of one MoE layout, for bench/moe_bench.sh.
-- Run: build/gen --lua bench/moe_traffic.lua MODEL [--tp N --pp N --dp N --ep N --etp N --vp N
--      --mbs N --nmb N --seq N] [--sp] [--dist-opt]
-- From inspect.moe_traffic (the report's numbers, a balanced load), per step: prints
--   group <ep|expt-tp> <members, comma-separated>          every group of those kinds
--   rank <r> <ep|expt-tp> <bytes sent> <bytes off-rank>    f32 payload of that rank's
--                                                          all-to-alls over the group per step
-- 'bytes sent' includes the blocks a rank sends itself: for the EP all-to-alls and the expert-TP
-- all-gathers it does not depend on the balance (every kept choice is sent exactly once), so the
-- measured world total must equal it when nothing is dropped; the off-rank part does depend on
-- the balance.

local config = require("config")
local inspect = require("inspect")
local partition = require("partition")
local topology = require("topology")

local model = assert(arg and arg[1], "usage: moe_traffic.lua MODEL [--tp N ...] [--sp]")
local opts, i = {}, 2
while arg[i] do
    local k = arg[i]:match("^%-%-(.+)$") or error("bad argument " .. arg[i])
    if k == "sp" or k == "dist-opt" then
        opts[k == "sp" and "sp" or "dist_opt"] = true
        i = i + 1
    else
        opts[k] = math.tointeger(tonumber(arg[i + 1])) or error("bad value for --" .. k)
        i = i + 2
    end
end
local cfg = config.configure(config.load_model(model), opts)
local topo = topology.build(cfg)
local part = partition.build(cfg, topo)
local t = assert(inspect.moe_traffic(cfg), "not a mixture-of-experts model")

for _, name in ipairs({ "ep", "expt-tp" }) do
    local kind = topology.kind(topo, name)
    if kind.size > 1 then
        for g = 0, kind.count - 1 do
            print("group " .. name .. " " .. table.concat(topology.members(kind, g), ","))
        end
    end
end
for r = 0, cfg.world - 1 do
    local layers = 0
    for _, ch in ipairs(part.stages[topology.coords(topo, r).pp + 1].chunks) do
        layers = layers + ch.count
    end
    local per = layers * cfg.nmb
    local sent, off = { ep = 0, ["expt-tp"] = 0 }, { ep = 0, ["expt-tp"] = 0 }
    for _, o in ipairs(t.ops) do
        sent[o.group] = sent[o.group] + per * o.sent
        off[o.group] = off[o.group] + per * o.off
    end
    for _, name in ipairs({ "ep", "expt-tp" }) do
        print(string.format("rank %d %s %.0f %.0f", r, name, sent[name], off[name]))
    end
end
