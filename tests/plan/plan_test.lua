-- tests/plan/plan_test.lua: properties of the planner (gen/lua/plan.lua) on small cases, run
-- with build/gen --lua. One line per verdict: "ok NAME" or "not ok NAME: WHY".
package.path = "gen/lua/?.lua;" .. package.path
local config = require("config")
local diag = require("diag")
local inspect = require("inspect")
local partition = require("partition")
local plan = require("plan")
local program = require("program")
local schedule = require("schedule")
local shards = require("shards")
local topology = require("topology")

local function verdict(name, ok, why)
    print(ok and ("ok " .. name) or ("not ok " .. name .. ": " .. tostring(why)))
end

plan.FULL_EVALS = 10000         -- evaluate everything: the properties hold over the whole set
local model = config.load_model("tiny")
local function run(opts)
    local dev = plan.device(opts)
    return plan.plan(model, opts, dev), dev
end
local function key(l) return plan.layout_text(l) .. " nmb" .. l.nmb end

-- 1. every listed layout is valid (configure) and fits; its memory is the full program's
local base = { model = "tiny", gpu = "cpu", gpu_mem = "1", cores = 2, gpus = 2, top = 1000 }
local p, dev = run(base)
local ok, why = #p.rows > 0, "no layout fits"
for _, r in ipairs(p.rows) do
    local cfg = r.cfg
    local topo = topology.build(cfg)
    local part = partition.build(cfg, topo)
    local sh = shards.build(cfg, topo, part)
    local prog = program.build(cfg, topo, part, sh,
                               schedule.build(cfg.pp, cfg.vp, cfg.nmb, cfg.mb_group))
    local most = 0
    for _, m in ipairs(inspect.memory(cfg, prog)) do most = math.max(most, m.peak_bytes) end
    if most ~= r.peak then
        ok, why = false, string.format("%s: planned %d bytes, the full program %d (built at " ..
                                       "nmb %d of %d)", key(r.l), r.peak, most, r.built_nmb, cfg.nmb)
    elseif most > dev.node_mem / 2 then
        ok, why = false, key(r.l) .. " does not fit"
    end
end
verdict("listed-valid-fitting-exact", ok, why)

-- 1b. the bound that prunes before the full passes is below every exact plan
ok, why = true, nil
for _, r in ipairs(p.rows) do
    local lb = plan.mem_bound(model, p.nweights, r.l, p.seq)
    if lb > r.peak then
        ok, why = false, string.format("%s: bound %d > plan %d", key(r.l), lb, r.peak)
    end
end
verdict("memory-bound-below-plan", ok, why)

-- 2. a rejected layout's reason is the generator's own error
ok, why = true, nil
local n_gen = 0
plan.FULL_EVALS = 1             -- (only the refusals matter here)
local p8 = run({ model = "tiny", gpu = "h100", gpus = 8, top = 1 })
plan.FULL_EVALS = 10000
for _, r in ipairs(p8.rejected) do
    if not r.why:match("GiB") then
        n_gen = n_gen + 1
        local o = { model = "tiny", tp = r.l.tp, pp = r.l.pp, dp = r.l.dp, cp = r.l.cp,
                    vp = r.l.vp, mbs = r.l.mbs, nmb = r.l.nmb, sp = r.l.sp or nil,
                    dist_opt = r.l.dist_opt or nil }
        if r.l.recompute ~= "none" then o.recompute = r.l.recompute end
        if r.l.recompute == "full" then o.recompute_method, o.recompute_layers = "uniform", 1 end
        local good, e = pcall(config.configure, model, o)
        local msg = not good and diag.lines(e) or {}
        for i, l in ipairs(msg) do msg[i] = l:gsub("^gen: error: ", "") end
        if good or table.concat(msg, "; ") ~= r.why then
            ok, why = false, key(r.l) .. ": '" .. r.why .. "' vs '" .. table.concat(msg, "; ") .. "'"
        end
    end
end
verdict("rejected-reason-is-generators", ok and n_gen > 0, why or "no layout rejected by gen")

-- 3. the best is the minimum of the predicted times
local best = math.huge
for _, r in ipairs(p.rows) do best = math.min(best, r.step) end
verdict("best-is-minimum", p.rows[1].step == best, p.rows[1].step .. " vs " .. best)

-- 4. more memory never removes a layout
local small = run({ model = "tiny", gpu = "cpu", gpu_mem = "0.016", cores = 2, gpus = 2,
                    top = 1000 })
local big = {}
for _, r in ipairs(p.rows) do big[key(r.l)] = true end
ok, why = #small.rows > 0 and #small.rows < #p.rows, string.format("%d fit in 16 MiB / 2, %d in 1 GiB / 2",
                                                                  #small.rows, #p.rows)
for _, r in ipairs(small.rows) do
    if not big[key(r.l)] then ok, why = false, key(r.l) .. " fits less memory only" end
end
verdict("more-memory-keeps-layouts", ok, why)

-- 5. known costs move the ranking the expected way
local function step_of(opts)
    local q = run(opts)
    return q.rows[1] and q.rows[1].step
end
local two = { model = "tiny", gpu = "h100", gpus = 2, tp = 1, pp = 1, dp = 2, mbs = 4, top = 1000 }
local function with(t, extra)
    local o = {}
    for k, v in pairs(t) do o[k] = v end
    for k, v in pairs(extra) do o[k] = v end
    return o
end
local intra = step_of(with(two, { gpus_per_node = 2, recompute = "selective" }))
local inter = step_of(with(two, { gpus_per_node = 1, recompute = "selective" }))
verdict("network-slower-than-nvlink", inter > intra, string.format("%g vs %g", inter, intra))
local none = step_of(with(two, { gpus_per_node = 2 }))
local full
do
    local q = run(with(two, { gpus_per_node = 2, recompute = "full" }))
    full = q.rows[1].step
end
verdict("full-recompute-slower", full > none, string.format("%g vs %g", full, none))
local sel = step_of(with(two, { gpus_per_node = 2, recompute = "selective" }))
verdict("selective-between", none < sel and sel < full, string.format("%g %g %g", none, sel, full))
-- a slower GEMM rate never makes a layout faster
local fast = step_of({ model = "tiny", gpu = "cpu", gpu_mem = "1", cores = 2, gpus = 2,
                       cpu_rates = "100,10", tp = 2, pp = 1, mbs = 4, top = 1000 })
local slow = step_of({ model = "tiny", gpu = "cpu", gpu_mem = "1", cores = 2, gpus = 2,
                       cpu_rates = "50,10", tp = 2, pp = 1, mbs = 4, top = 1000 })
verdict("slower-gemm-slower-step", slow > fast, string.format("%g vs %g", slow, fast))

-- 6. the extended schedule (plan.timeline beyond 4 m micro-batches) is the simulated one
local svg = require("svg")
ok, why = true, nil
for _, c in ipairs({ { pp = 4, vp = 1, nmb = 64, m = 4 }, { pp = 4, vp = 2, nmb = 64, m = 8 },
                     { pp = 3, vp = 1, nmb = 40, m = 3 }, { pp = 2, vp = 8, nmb = 160, m = 2 },
                     { pp = 4, vp = 3, nmb = 240, m = 4 } }) do
    local cfgx = { pp = c.pp, vp = c.vp, nmb = c.nmb, mb_group = c.pp }
    local function cost(r, kind, chunk) return (kind == "F" and 1 or 2.1) * (1 + 0.3 * r) + 0.1 * chunk end
    local ext = plan.timeline(cfgx, c.m, cost)
    local full = svg.timeline(schedule.build(c.pp, c.vp, c.nmb, c.pp), cost)
    if math.abs(ext.makespan - full.makespan) > 1e-9 * full.makespan then
        ok, why = false, string.format("pp%d vp%d nmb%d: %g vs %g", c.pp, c.vp, c.nmb,
                                       ext.makespan, full.makespan)
    end
    for r = 0, c.pp - 1 do
        if math.abs(ext.stages[r].finish - full.stages[r].finish) > 1e-9 * full.makespan then
            ok, why = false, string.format("pp%d vp%d stage %d finishes at %g, simulated %g",
                                           c.pp, c.vp, r, ext.stages[r].finish,
                                           full.stages[r].finish)
        end
    end
end
verdict("extended-schedule-is-simulated", ok, why)

-- 7. the CPU's shared cores (plan.shared_timeline): with a core per rank it is svg.timeline
-- (every box, every finish), on one stage it stretches the costs by ranks / cores, and by hand:
-- PP 2, 2 micro-batches, F = B = 1 on 1.5 cores: F0 on stage 0 alone (t = 1); F1 there beside
-- F0 on stage 1, each at 0.75 (t = 2.33); stage 1's B0 alone (3.33); stage 0's B0 beside stage
-- 1's F1 (4.67); stage 1's B1 alone (5.67); stage 0's B1 alone (6.67 = 20/3)
ok, why = true, nil
for _, c in ipairs({ { 2, 1, 4 }, { 2, 2, 2 }, { 2, 2, 4 }, { 4, 1, 8 }, { 4, 2, 8 }, { 3, 1, 5 },
                     { 4, 3, 12 } }) do
    local pp, vp, nmb = c[1], c[2], c[3]
    local function cost(r, kind, chunk) return (kind == "F" and 1 or 2.1) * (1 + 0.3 * r) + 0.1 * chunk end
    local sc = schedule.build(pp, vp, nmb, pp)
    local a, b = plan.shared_timeline(sc, cost, 2 * pp, 2), svg.timeline(sc, cost)
    for r = 0, pp - 1 do
        local ba, bb = a.stages[r].boxes, b.stages[r].boxes
        local same = #ba == #bb and math.abs(a.stages[r].finish - b.stages[r].finish) < 1e-9
        for i = 1, math.min(#ba, #bb) do
            same = same and ba[i].kind == bb[i].kind and ba[i].mb == bb[i].mb and
                   math.abs(ba[i].t0 - bb[i].t0) < 1e-9 and math.abs(ba[i].t1 - bb[i].t1) < 1e-9
        end
        if not same then
            ok, why = false, string.format("pp%d vp%d nmb%d stage %d: finish %g, svg.timeline %g",
                                           pp, vp, nmb, r, a.stages[r].finish, b.stages[r].finish)
        end
    end
end
verdict("shared-cores-enough-is-timeline", ok, why)
local one = plan.shared_timeline(schedule.build(1, 1, 3, 1), function(_, kind) return kind == "F" and 1 or 2 end, 2, 4)
verdict("shared-cores-one-stage", math.abs(one.makespan - 18) < 1e-9, one.makespan)
local hand = plan.shared_timeline(schedule.build(2, 1, 2, 2), function() return 1 end, 1.5, 1)
verdict("shared-cores-by-hand", math.abs(hand.makespan - 20 / 3) < 1e-9, hand.makespan)
