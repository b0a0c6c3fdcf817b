-- plan.lua: which layout to train a model with on N devices (gen --plan, make plan). Enumerates
-- the layouts of N ranks, runs the generator's own passes on them (config.configure decides
-- what is valid, program.build and inspect.memory what a rank allocates), keeps those that fit
-- the device's memory, predicts each one's step time and ranks them. Pure: returns the report
-- as a string; every constant is stated in docs/PLAN.md with where it comes from.
--
-- The step-time model (docs/PLAN.md §2): each stage's forward and backward of one micro-batch
-- cost its FLOPs at the device's GEMM rate, its element-wise bytes at its memory bandwidth and
-- its launches, plus the collectives the program runs inside them (the IR's Coll lists, priced
-- as ring or tree on NVLink within a node and the network between nodes) and its pipeline
-- sends; the schedule itself is simulated with those costs (svg.timeline: the bubble); the
-- data-parallel reductions run where overlap.lua placed them; then the optimizer and the
-- step's tail collectives.

local config = require("config")
local diag = require("diag")
local inspect = require("inspect")
local partition = require("partition")
local program = require("program")
local schedule = require("schedule")
local shards = require("shards")
local svg = require("svg")
local topology = require("topology")
local util = require("util")

local M = {}

local GIB = 1024.0 * 1024 * 1024
local MIB = 1024 * 1024

--[[
** The devices (docs/PLAN.md §3). mem: the bytes a process may plan for: the card's memory as
** CUDA reports it less CONTEXT_RESERVE (the CUDA context and the libraries' handles, which no
** plan counts). gemm: the bf16 GEMM rate reached (the H200's measured 784 TFLOP/s of docs/GPU.md;
** H100 and H200 share the GH100 chip and its clocks; the A100 scaled by the same 0.79 of its
** datasheet). bw: the memory bandwidth reached (H200 measured 4.29 TB/s = 0.89 of its 4.8
** datasheet; the others at the same 0.89). peak: the datasheet dense bf16 rate (MFU).
** nvlink: bytes/s one GPU sends to the others of its node (half the datasheet's bidirectional
** figure); net: bytes/s of one GPU's network port (one 400 Gb/s NDR, 200 Gb/s HDR on A100
** systems). Latencies: per step of a ring.
]]
M.CONTEXT_RESERVE = 512 * MIB
M.DEVICES = {
    h100 = { text = "NVIDIA H100 SXM 80 GB", mem = 81559 * MIB, gemm = 784e12, bw = 2.98e12,
             peak = 989e12, launch = 4e-6, nvlink = 450e9, nvlink_lat = 3e-6, net = 50e9,
             net_lat = 8e-6, bf16 = true },
    h200 = { text = "NVIDIA H200 SXM 141 GB", mem = 143771 * MIB, gemm = 784e12, bw = 4.29e12,
             peak = 989e12, launch = 4e-6, nvlink = 450e9, nvlink_lat = 3e-6, net = 50e9,
             net_lat = 8e-6, bf16 = true },
    a100 = { text = "NVIDIA A100 SXM 80 GB", mem = 81920 * MIB, gemm = 247e12, bw = 1.82e12,
             peak = 312e12, launch = 4e-6, nvlink = 300e9, nvlink_lat = 3e-6, net = 25e9,
             net_lat = 8e-6, bf16 = true },
    -- one core of this machine, as bench/plan_bench.sh measured it: oneDNN's f32 matmul at
    -- 512^3 (gemm) and the library's element-wise kernels (bw, bench/elem_rate.c); --cpu-rates
    -- gives others. Ranks share the cores and the memory; their transport (the runtime's
    -- collectives over MPI's shared memory) moves nvlink bytes/s, rt_allreduce's bus bandwidth
    -- on 2 ranks (bench/runtime_bench.c transport), with nvlink_lat per message (assumed).
    cpu = { text = "CPU", gemm = 190e9, bw = 16e9, peak = 190e9, launch = 0, nvlink = 5.9e9,
            nvlink_lat = 5e-6, net = 5.9e9, net_lat = 5e-6, bf16 = false },
}
M.GPU_NAMES = { "h100", "h200", "a100", "cpu" }

-- Element-wise bytes of one layer's forward and backward per token, in units of C activation
-- elements: bench/cost_model.py's non-GEMM launches of a GPT layer (LayerNorm, bias, GELU,
-- residual, attention's inputs and outputs), those TP splits and those it replicates (unless SP).
M.LAYER_BYTES_SPLIT = 61
M.LAYER_BYTES_REPL = 26
M.LAUNCHES_PER_LAYER = 70        -- cost_model.py: 964 launches for 12 layers and the rest
M.FWD_SHARE = 0.4                -- of those bytes in the forward (cost_model.py: 40 of 87)
M.DEFAULT_GBS_PER_RANK = 8       -- GBS when not given: 8 sequences per rank
M.TOP = 10                       -- layouts the table shows
M.MAX_VP = 8                     -- virtual stages tried
M.MAX_MBS = 8                    -- largest micro-batch tried
M.MAX_CP = 8
M.FULL_EVALS = 16                -- most layouts run through every pass (the rest: estimate)
M.MAX_FULL_EVALS = 64            -- ... while none of them fits

-- -- Devices ------------------------------------------------------------------------------------

-- The device of opts (gpu, gpu_mem in GiB as text, cpu_rates "GFLOPS,GB/s[,GB/s]", cores, gpus,
-- gpus_per_node): a copy of its M.DEVICES entry with mem (per rank) filled in.
function M.device(opts)
    local name = opts.gpu or "h100"
    local base = M.DEVICES[name]
    if not base then
        diag.error(nil, "GPU=%s: unknown device (one of: %s)", name,
                   table.concat(M.GPU_NAMES, ", "))
    end
    local d = {}
    for k, v in pairs(base) do d[k] = v end
    d.name = name
    if opts.gpu_mem then
        local g = tonumber(opts.gpu_mem)
        if not g or g <= 0 or g > 1e6 then
            diag.error(nil, "GPU_MEM=%s: the memory of one device in GiB (a number, e.g. 79.1)",
                       opts.gpu_mem)
        end
        d.mem = g * GIB
        d.mem_given = true
    elseif name ~= "cpu" then
        d.mem = d.mem - M.CONTEXT_RESERVE
    end
    if name == "cpu" then
        if opts.cpu_rates then
            local f, b, l = opts.cpu_rates:match("^([%d.]+),([%d.]+)$")
            if not f then f, b, l = opts.cpu_rates:match("^([%d.]+),([%d.]+),([%d.]+)$") end
            if not f or not tonumber(f) or not tonumber(b) or tonumber(f) <= 0
               or tonumber(b) <= 0 or (l and (not tonumber(l) or tonumber(l) <= 0)) then
                diag.error(nil, "--cpu-rates %s: GFLOPS,GB/s of one core and optionally the " ..
                           "ranks' all-reduce bus GB/s (e.g. 60,8 or 60,8,5)", opts.cpu_rates)
            end
            d.gemm, d.peak, d.bw = tonumber(f) * 1e9, tonumber(f) * 1e9, tonumber(b) * 1e9
            if l then d.nvlink, d.net = tonumber(l) * 1e9, tonumber(l) * 1e9 end
        end
        d.cores = opts.cores or 1
        if not d.mem then
            diag.error(nil, "GPU=cpu needs GPU_MEM (the machine's memory in GiB; make plan " ..
                       "passes it)")
        end
        -- the ranks of a node share its memory
        d.node_mem = d.mem
    end
    return d
end

-- Per-rank rates of a layout of 'per_node' ranks on one node when they all compute at once: on
-- the CPU, ranks beyond the cores share them. The forward and backward are priced at the
-- per-core rates and the schedule simulation shares the cores among the stages computing at
-- each moment (M.shared_timeline); the optimizer, which every rank runs at once, at these.
local function rates(dev, per_node)
    local share = 1.0
    if dev.name == "cpu" then share = math.min(1.0, dev.cores / per_node) end
    return dev.gemm * share, dev.bw * share
end

--[[
** The schedule of sched on 'cores' cores shared by its stages, 'per_stage' ranks each (the CPU
** device): svg.timeline's simulation with the operating system's processor sharing. While n
** ranks compute, each advances at min(1, cores / n) of its own rate; a rank waiting for a
** pipeline message gives its core away (on an oversubscribed node the runtime's wait yields,
** then sleeps).
** cost(r, kind, chunk) is an F's or B's time alone on a core. Returns svg.timeline's record.
** Messages take no time here (cost folds them into the F and B that send them), so an exchange
** completes when its last side posts.
]]
function M.shared_timeline(sched, cost, cores, per_stage)
    local P = sched.P
    local pc, out, pending, work = {}, {}, {}, {}
    for r = 0, P - 1 do pc[r], out[r] = 1, { boxes = {}, finish = 0 } end
    -- finish: when the stage last moved (its last exchange may complete after its last B)
    local post, now = svg.channels(P), 0
    -- take stage r's steps until it computes, waits or ends
    local function advance(r)
        local steps, moved = sched.stages[r + 1].steps, false
        while not work[r] and pc[r] <= #steps do
            local st = steps[pc[r]]
            if st.kind == "F" or st.kind == "B" then
                local b = out[r].boxes
                b[#b + 1] = { kind = st.kind, mb = st.mb, chunk = st.chunk, t0 = now }
                work[r] = { left = cost(r, st.kind, st.chunk), box = b[#b] }
                pc[r] = pc[r] + 1
                return true
            end
            if not pending[r] then      -- a post may complete another stage's wait
                pending[r], moved = post(r, st, now), true
            end
            for _, item in ipairs(pending[r]) do
                if not item.done then return moved end
            end
            pending[r], pc[r], moved = nil, pc[r] + 1, true
            out[r].finish = now
        end
        return moved
    end
    while true do
        svg.settle(P, advance)
        local n, dt = 0, math.huge
        for r = 0, P - 1 do
            if work[r] then n, dt = n + 1, math.min(dt, work[r].left) end
        end
        if n == 0 then break end
        local rate = math.min(1.0, cores / (n * per_stage))
        now = now + dt / rate
        for r = 0, P - 1 do
            local w = work[r]
            if w then
                w.left = w.left - dt
                if w.left <= dt * 1e-9 then
                    w.box.t1, work[r], out[r].finish = now, nil, now
                end
            end
        end
    end
    local makespan, busy = 0, 0
    for r = 0, P - 1 do
        assert(pc[r] > #sched.stages[r + 1].steps,
               "plan.shared_timeline: the schedule does not finish")
        makespan = math.max(makespan, out[r].finish)
    end
    for _, b in ipairs(out[0].boxes) do busy = busy + (b.t1 - b.t0) end
    return { makespan = makespan, busy = busy, stages = out }
end

-- -- Collectives --------------------------------------------------------------------------------

local DSIZE = { f32 = 4, bf16 = 2, i32 = 4 }

-- Bytes one member sends for collective c and its time on 'link' {bw, lat} in a group of g.
-- allreduce: ring 2(g-1)/g of the data in 2(g-1) steps, or a double binary tree (2 log2 g
-- steps, each byte twice), whichever is faster (NCCL picks the same way); allgather and
-- reduce_scatter: n per member, (g-1) steps; all-to-all: (g-1)/g of what it holds; a cp ring
-- hop: one message each way.
function M.coll_cost(c, g, link)
    if g <= 1 then return 0, 0 end
    local ds = DSIZE[c.dtype] or 4
    local a, b = link.lat, link.bw
    if c.op == "allreduce" then
        local n = c.n * ds
        local ring = 2 * (g - 1) * a + 2 * (g - 1) / g * n / b
        local tree = 2 * math.ceil(math.log(g, 2)) * a + 2 * n / b
        return 2 * (g - 1) / g * n, math.min(ring, tree)
    elseif c.op == "allgather" or c.op == "reduce_scatter" then
        local n = c.n * ds
        return (g - 1) * n, (g - 1) * a + (g - 1) * n / b
    elseif c.op == "alltoall" or c.op == "alltoallv" then
        local n = c.n and c.n * ds * g or (c.rows or 0) * (c.width or 0) * ds * g
        return (g - 1) / g * n, (g - 1) * a + (g - 1) / g * n / b
    elseif c.op == "ring" then
        local n = (c.n or 0) * ds + (c.n2 or 0) * 4
        return n, a + n / b
    end
    error("plan: unknown collective " .. tostring(c.op))
end

-- Per kind name: { size, inter = whether a group of it spans nodes }.
local function group_links(cfg, topo, per_node)
    local out = { world = { size = cfg.world, inter = cfg.world > per_node } }
    for _, k in ipairs(topo.kinds) do
        local m = topology.members(k, 0)
        local lo, hi = m[1], m[1]
        for _, r in ipairs(m) do lo, hi = math.min(lo, r), math.max(hi, r) end
        out[k.name] = { size = k.size, inter = lo // per_node ~= hi // per_node }
    end
    return out
end

local function link_of(dev, inter)
    if inter then return { bw = dev.net, lat = dev.net_lat } end
    return { bw = dev.nvlink, lat = dev.nvlink_lat }
end

-- -- One layout: every pass, memory, time --------------------------------------------------------

-- The micro-batch count the program is built with: the schedule's slots (what memory depends
-- on) are those of NMB once NMB is large enough, so larger counts are built at the smallest
-- multiple of the micro-batch group from PP (or 2 x PP) whose slots match twice as many, and
-- the per-micro-batch counts scaled.
local function build_nmb(cfg)
    local g = cfg.vp > 1 and cfg.mb_group or 1
    if cfg.nmb % g ~= 0 then return cfg.nmb end
    for _, m in ipairs({ util.round_up(cfg.pp, g), util.round_up(2 * cfg.pp, g) }) do
        if m >= cfg.nmb then return cfg.nmb end
        -- against twice as many (or all): in flight stops growing once the warm-up is full
        local full = schedule.build(cfg.pp, cfg.vp, math.min(2 * m, cfg.nmb), cfg.mb_group)
        local small = schedule.build(cfg.pp, cfg.vp, m, cfg.mb_group)
        local same = true
        for r = 1, cfg.pp do
            for _, pooled in ipairs({ false, true }) do
                local a = schedule.assign_slots(full.stages[r], cfg.vp, pooled)
                local b = schedule.assign_slots(small.stages[r], cfg.vp, pooled)
                same = same and a.inflight == b.inflight
                for v = 0, cfg.vp - 1 do same = same and a.nslots[v] == b.nslots[v] end
            end
        end
        if same then return m end
    end
    return cfg.nmb
end

-- The simulated schedule of cfg (svg.timeline) with 'cost'. Beyond 4 x m micro-batches (m:
-- the count the program was built with, at least 2 P V) the schedules of m and 2 m are
-- simulated and the steady state extended to NMB: each further micro-batch adds what the m
-- between them added per micro-batch (exact once the pipeline is full; tests/plan compares).
-- The boxes are those of the 2 m schedule, the last micro-batch's renumbered and moved.
function M.timeline(cfg, m, cost, sim)
    sim = sim or svg.timeline
    -- the steady state: past the warm-up of every stage (2 P V chunk steps)
    local g = cfg.vp > 1 and cfg.mb_group or 1
    m = util.round_up(math.max(m, 2 * cfg.pp * cfg.vp), g)
    -- the extension goes in steps of m: the next multiple of g that divides NMB, if one is
    -- small enough (gpt3_175b PP 32 VP 3 NMB 2048: 256, not 192, which would simulate all)
    while m <= cfg.nmb // 4 and cfg.nmb % m ~= 0 do m = m + g end
    if cfg.nmb <= 4 * m or cfg.nmb % m ~= 0 then
        return sim(schedule.build(cfg.pp, cfg.vp, cfg.nmb, cfg.mb_group), cost)
    end
    local t1 = sim(schedule.build(cfg.pp, cfg.vp, m, cfg.mb_group), cost)
    local t2 = sim(schedule.build(cfg.pp, cfg.vp, 2 * m, cfg.mb_group), cost)
    local k = (cfg.nmb - 2 * m) / m
    local out = { makespan = t2.makespan + k * (t2.makespan - t1.makespan), stages = {} }
    for r = 0, cfg.pp - 1 do
        local a, b = t1.stages[r], t2.stages[r]
        local shift = k * (b.finish - a.finish)
        local boxes = {}
        local busy1, busy2 = 0, 0
        for _, x in ipairs(a.boxes) do busy1 = busy1 + (x.t1 - x.t0) end
        for _, x in ipairs(b.boxes) do
            busy2 = busy2 + (x.t1 - x.t0)
            if x.mb == 2 * m - 1 then
                boxes[#boxes + 1] = { kind = x.kind, mb = cfg.nmb - 1, chunk = x.chunk,
                                      t0 = x.t0 + shift, t1 = x.t1 + shift }
            end
        end
        out.stages[r] = { finish = b.finish + shift, boxes = boxes,
                          busy = busy2 + k * (busy2 - busy1) }
    end
    return out
end

-- The largest items of a stage's memory (inspect.memory's record), "params 3.2 GiB, ...".
function M.largest(m, n)
    local items = {
        { "parameters", m.parameters }, { "main parameters", m.main_parameters },
        { "gradients", m.gradients }, { "optimizer moments", m.optimizer_state },
        { "activations", m.activations.bytes }, { "recompute workspace", m.recompute_workspace },
        { "communication buffers", m.communication }, { "workspace", m.workspace },
    }
    table.sort(items, function(a, b) return a[2] > b[2] end)
    local out = {}
    for i = 1, n or 3 do
        if items[i][2] > 0 then out[#out + 1] = items[i][1] .. " " .. util.bytes(items[i][2]) end
    end
    return table.concat(out, ", ")
end

-- Bytes a stage's rank needs on 'dev' (the GPU total with the runtime's workspaces and
-- NCCL's buffers; on the CPU the allocated total).
function M.stage_bytes(dev, m)
    return dev.name == "cpu" and m.peak_bytes or m.cuda.peak_bytes
end

-- The memory check of a built program against dev: nil when every stage fits, else the
-- message naming the worst stage and its largest items.
function M.misfit(cfg, prog, dev, per_node)
    local cap = dev.mem
    if dev.name == "cpu" then cap = dev.node_mem / math.min(per_node, cfg.world) end
    local worst, wb = nil, -1
    for _, m in ipairs(inspect.memory(cfg, prog)) do
        local b = M.stage_bytes(dev, m)
        if b > wb then worst, wb = m, b end
    end
    if wb <= cap then return nil, wb end
    return string.format("stage %d (ranks %s) needs %.1f GiB > %.1f GiB%s: %s", worst.stage,
                         worst.ranks, wb / GIB, cap / GIB,
                         dev.name == "cpu" and " (its share of the machine)" or "",
                         M.largest(worst)), wb
end

-- Every pass on opts; returns the record of the layout or nil, reason (the generator's error).
local function passes(model, opts)
    local ok, cfg = pcall(config.configure, model, opts)
    if not ok then
        if diag.is_user_error(cfg) then
            local lines = diag.lines(cfg)
            for i, l in ipairs(lines) do lines[i] = l:gsub("^gen: error: ", "") end
            return nil, table.concat(lines, "; ")
        end
        error(cfg, 0)
    end
    local good, why = program.supported(cfg)
    if not good then return nil, why end
    return cfg
end

-- The full evaluation of a valid cfg: memory, communication, time. Returns a record or nil,
-- reason.
function M.evaluate(cfg, dev, per_node, verify)
    local nmb = build_nmb(cfg)
    local bcfg = cfg
    if nmb ~= cfg.nmb then
        bcfg = setmetatable({ nmb = nmb }, { __index = cfg })
    end
    local ok, res = pcall(function()
        local topo = topology.build(bcfg)
        local part = partition.build(bcfg, topo)
        local sh = shards.build(bcfg, topo, part)
        local sched = schedule.build(bcfg.pp, bcfg.vp, bcfg.nmb, bcfg.mb_group)
        local prog = program.build(bcfg, topo, part, sh, sched, { verify = verify == true })
        return { topo = topo, part = part, prog = prog }
    end)
    if not ok then
        if diag.is_user_error(res) then
            local lines = diag.lines(res)
            for i, l in ipairs(lines) do lines[i] = l:gsub("^gen: error: ", "") end
            return nil, table.concat(lines, "; ")
        end
        error(res, 0)
    end
    local prog, topo, part = res.prog, res.topo, res.part
    -- memory: the program's plan (the loss array grows with NMB: 4 bytes a micro-batch)
    local misfit, peak = M.misfit(bcfg, prog, dev, per_node)
    peak = peak + 4 * (cfg.nmb - nmb)
    if misfit then return nil, misfit, peak end
    local mem = inspect.memory(bcfg, prog)

    local links = group_links(cfg, topo, per_node)
    -- the forward and backward at one rank's own rates (on the CPU the simulation shares the
    -- cores); the optimizer, which every rank of the node runs at once, at their shared rates
    local ranks_here = math.min(per_node, cfg.world)
    local gemm, bw = dev.gemm, dev.bw
    local _, all_bw = rates(dev, ranks_here)
    local sim
    if dev.name == "cpu" then
        sim = function(sc, c) return M.shared_timeline(sc, c, dev.cores, ranks_here / cfg.pp) end
    end
    local s = program.sizes(cfg)
    local f_layer, f_head, f_attn = program.flops_per_token(cfg, s)
    local tok = cfg.mbs * cfg.seq / cfg.cp        -- this rank's tokens of a micro-batch
    local A = cfg.bf16 and 2 or 4
    local C = cfg.model.hidden
    local TP = cfg.tp
    local lbytes = (M.LAYER_BYTES_SPLIT / TP + M.LAYER_BYTES_REPL / (cfg.sp and TP or 1))
                   * C * A * tok
    local scale = cfg.nmb / nmb                   -- per-micro-batch counts of the built program
    -- the bytes a rank of each stage sends per step, by group: kind -> { bytes, inter }
    local comm_of, comm = {}, nil
    local function add_comm(kind, bytes)
        local l = links[kind] or { inter = false }
        local e = comm[kind] or { bytes = 0, inter = l.inter }
        e.bytes = e.bytes + bytes
        comm[kind] = e
    end
    local function coll_time(c, times)
        local l = links[c.group]
        local g = l and l.size or 1
        local bytes, t = M.coll_cost(c, g, link_of(dev, l and l.inter))
        add_comm(c.group, bytes * (times or 1))
        return t
    end
    local pp_link = link_of(dev, links.pp and links.pp.inter)

    -- per stage and chunk: the cost of one F and one B (compute, their collectives, sends)
    local cost, tails = {}, {}
    for _, sp in ipairs(prog.stages) do
        local r = sp.stage
        local st = part.stages[r + 1]
        comm = {}
        comm_of[r] = comm
        local c_r = {}
        local recompute_extra = 0
        local n_f, sends = 0, { act = 0, grad = 0 }
        for _, o in ipairs(sp.schedule) do
            if o.kind == "F" then n_f = n_f + 1 end
            if o.kind == "X" and not o.async then
                for _, m in ipairs(o.p2p) do
                    if m.send then
                        local bytes = m.n * (DSIZE[m.dtype] or 4)
                        add_comm("pp", bytes * scale)
                        sends[m.what] = sends[m.what] + pp_link.lat + bytes / pp_link.bw
                    end
                end
            end
        end
        for v, ch in ipairs(st.chunks) do
            local nl = ch.count
            local ff = nl * f_layer * tok / TP
            local fb = lbytes * nl
            local F = ff / gemm + M.FWD_SHARE * fb / bw +
                      nl * M.LAUNCHES_PER_LAYER * 0.4 * dev.launch
            local B = 2 * ff / gemm + (1 - M.FWD_SHARE) * fb / bw +
                      nl * M.LAUNCHES_PER_LAYER * 0.6 * dev.launch
            if cfg.recompute == "full" then
                B = B + F
                recompute_extra = recompute_extra + F
            elseif cfg.recompute == "selective" then
                local x = 0
                for _, mod in ipairs(cfg.recompute_modules) do
                    if mod == "core_attn" then x = x + nl * f_attn * tok / TP / gemm
                    elseif mod == "mlp" then
                        x = x + nl * 2 * C * cfg.model.ffn_hidden * tok / TP / gemm
                    else x = x + 4 * nl * C * A * tok / (cfg.sp and TP or 1) / bw end
                end
                B = B + x
            end
            if ch.head then F = F + 3 * f_head * tok / TP / gemm + 4 * tok * cfg.vocab_padded
                                / TP * A / bw end
            if ch.embedding then F = F + 2 * tok * C * A / bw end
            c_r[v - 1] = { F = F, B = B }
        end
        -- the collectives of one F and one B of each chunk (micro-batch 0's)
        for _, o in ipairs(sp.schedule) do
            if (o.kind == "F" or o.kind == "B") and o.mb == 0 then
                local t = 0
                for _, c in ipairs(o.comm) do t = t + coll_time(c, cfg.nmb) end
                c_r[o.chunk][o.kind] = c_r[o.chunk][o.kind] + t
            end
        end
        local nchunks = #st.chunks
        for v = 0, nchunks - 1 do
            c_r[v].F = c_r[v].F + sends.act / math.max(n_f, 1)
            c_r[v].B = c_r[v].B + sends.grad / math.max(n_f, 1)
        end
        cost[r] = c_r
        -- the tail: optimizer bytes, the collectives after the schedule
        local m = mem[r + 1]
        local opt = (3 * m.gradients + 2 * m.optimizer_state + 2 * m.main_parameters +
                     m.parameters) / all_bw
        local tail, dp_sync = 0, 0
        for _, o in ipairs(sp.tail) do
            if o.kind ~= "SCHEDULE" then
                for _, c in ipairs(o.comm) do
                    local t = coll_time(c)
                    if o.kind == "DP_REDUCE" then dp_sync = dp_sync + t else tail = tail + t end
                end
            end
        end
        -- overlapped reductions and gathers (overlap.lua's plan)
        local red, gath = {}, {}
        if cfg.overlap then
            for _, a in ipairs(sp.overlap.reduce) do
                local t = 0
                for _, stmt in ipairs(a.stmts) do
                    if stmt.coll then t = t + coll_time(stmt.coll) end
                end
                red[#red + 1] = { op = a, t = t }
            end
            for _, a in ipairs(sp.overlap.gather) do
                local t = 0
                for _, stmt in ipairs(a.stmts) do
                    if stmt.coll then t = t + coll_time(stmt.coll) end
                end
                gath[#gath + 1] = t
            end
        end
        tails[r] = { opt = opt, tail = tail, dp_sync = dp_sync, red = red, gath = gath,
                     recompute = recompute_extra }
    end

    local tl = M.timeline(cfg, nmb, function(r, kind, chunk) return cost[r][chunk][kind] end,
                        sim)
    local lanes = cfg.overlap and inspect.comm_lanes(bcfg, prog) or {}
    local step, busy_max = 0, 0
    for r = 0, cfg.pp - 1 do
        local t = tails[r]
        local fin = tl.stages[r].finish
        local busy = tl.stages[r].busy
        if not busy then
            busy = 0
            for _, b in ipairs(tl.stages[r].boxes) do busy = busy + (b.t1 - b.t0) end
        end
        busy_max = math.max(busy_max, busy)
        -- reductions start where the last micro-batch's backward wrote their gradients
        local comm_end = fin
        if #t.red > 0 then
            local clock = 0
            for _, lane in ipairs(lanes[r] or {}) do
                if lane.kind == "reduce" then
                    local ready = fin
                    for _, b in ipairs(tl.stages[r].boxes) do
                        if b.kind == "B" and b.mb == cfg.nmb - 1 and b.chunk == lane.at.chunk then
                            ready = b.t0 + lane.at.frac * (b.t1 - b.t0)
                        end
                    end
                    local rt = 0
                    for _, x in ipairs(t.red) do if x.op == lane.op then rt = x.t end end
                    clock = math.max(clock, ready) + rt
                end
            end
            comm_end = math.max(fin, clock)
        end
        -- the parameter all-gathers overlap the next step's first forward
        local g = 0
        for _, x in ipairs(t.gath) do g = g + x end
        local first_f = cost[r][0].F
        local exposed_gather = math.max(0, g - first_f)
        local total = comm_end + t.dp_sync + t.opt + t.tail + exposed_gather
        step = math.max(step, total)
    end
    local flops = program.model_flops(cfg, s)
    -- per group, the most a rank of any stage sends (the stages' ranks send at once)
    comm = {}
    for r = 0, cfg.pp - 1 do
        for k, e in pairs(comm_of[r] or {}) do
            if not comm[k] or e.bytes > comm[k].bytes then comm[k] = e end
        end
    end
    local comm_list = {}
    for k, e in util.sortedpairs(comm) do
        if e.bytes > 0 then
            comm_list[#comm_list + 1] = { kind = k, bytes = e.bytes, inter = e.inter }
        end
    end
    return {
        cfg = cfg, peak = peak, mem = mem, step = step, makespan = tl.makespan,
        bubble = tl.makespan > 0 and (tl.makespan - busy_max) / tl.makespan or 0,
        tokens = cfg.mbs * cfg.nmb * cfg.dp * cfg.seq / step,
        mfu = flops / (step * cfg.world * dev.peak), comm = comm_list, built_nmb = nmb,
    }
end

-- -- Enumeration --------------------------------------------------------------------------------

local function divisors(n, most)
    local out = {}
    for d = 1, math.min(n, most or n) do
        if n % d == 0 then out[#out + 1] = d end
    end
    return out
end

local RECOMPUTE = { "none", "selective", "full" }

-- The generator options of one layout (the keys config.configure reads).
local function layout_opts(base, l)
    local o = { model = base.model, tp = l.tp, pp = l.pp, dp = l.dp, cp = l.cp, vp = l.vp,
                mbs = l.mbs, nmb = l.nmb, seq = base.seq, bf16 = l.bf16 or nil,
                sp = l.sp or nil, dist_opt = l.dist_opt or nil }
    if l.ep > 1 then o.ep = l.ep end
    if l.recompute ~= "none" then o.recompute = l.recompute end
    if l.recompute == "full" then o.recompute_method, o.recompute_layers = "uniform", 1 end
    return o
end

-- The make command of a layout.
function M.make_command(model_name, l)
    local w = { "make", "MODEL=" .. model_name, "TP=" .. l.tp, "PP=" .. l.pp, "DP=" .. l.dp }
    if l.cp > 1 then w[#w + 1] = "CP=" .. l.cp end
    if l.ep > 1 then w[#w + 1] = "EP=" .. l.ep end
    if l.vp > 1 then w[#w + 1] = "VP=" .. l.vp end
    w[#w + 1] = "MBS=" .. l.mbs
    w[#w + 1] = "NMB=" .. l.nmb
    if l.seq then w[#w + 1] = "SEQ=" .. l.seq end
    if l.sp then w[#w + 1] = "SP=1" end
    if l.dist_opt then w[#w + 1] = "DIST_OPT=1" end
    if l.bf16 then w[#w + 1] = "BF16=1" end
    if l.recompute == "selective" then w[#w + 1] = "RECOMPUTE=selective" end
    if l.recompute == "full" then
        w[#w + 1] = "RECOMPUTE=full RECOMPUTE_METHOD=uniform RECOMPUTE_LAYERS=1"
    end
    return table.concat(w, " ")
end

-- A layout in a few words: "tp8 pp16 dp8 vp3 mbs1 sp dopt rc=sel".
function M.layout_text(l)
    local w = { "tp" .. l.tp, "pp" .. l.pp, "dp" .. l.dp }
    if l.cp > 1 then w[#w + 1] = "cp" .. l.cp end
    if l.ep > 1 then w[#w + 1] = "ep" .. l.ep end
    if l.vp > 1 then w[#w + 1] = "vp" .. l.vp end
    w[#w + 1] = "mbs" .. l.mbs
    if l.sp then w[#w + 1] = "sp" end
    if l.dist_opt then w[#w + 1] = "dopt" end
    if l.recompute ~= "none" then w[#w + 1] = l.recompute == "full" and "rc=full" or "rc=sel" end
    return table.concat(w, " ")
end

-- Every combination of the choice lists axes[i] = { name, values } (the first varying
-- slowest), each handed to f as a table name -> value.
local function each_product(axes, f, i, pick)
    i, pick = i or 1, pick or {}
    if i > #axes then return f(pick) end
    for _, v in ipairs(axes[i][2]) do
        pick[axes[i][1]] = v
        each_product(axes, f, i + 1, pick)
    end
end

-- Every candidate layout of N ranks (the sizes only: validity is configure's).
function M.candidates(model, N, per_node, gbs, bf16, only_mbs)
    local out = {}
    local moe = model.moe
    for _, tp in ipairs(divisors(math.min(N, per_node))) do
        if N % tp == 0 then
            for _, cp in ipairs(divisors(N // tp, M.MAX_CP)) do
                for _, pp in ipairs(divisors(N // (tp * cp), model.layers)) do
                    local dp = N // (tp * cp * pp)
                    local vps, mbss = { 1 }, {}
                    for v = 2, pp > 1 and M.MAX_VP or 1 do
                        if model.layers % (pp * v) == 0 then vps[#vps + 1] = v end
                    end
                    local mbs = only_mbs or 1    -- MBS given, or 1, 2, 4, ... MAX_MBS
                    while mbs <= (only_mbs or M.MAX_MBS) do
                        if gbs % (mbs * dp) == 0 then mbss[#mbss + 1] = mbs end
                        mbs = mbs * 2
                    end
                    each_product({
                        { "vp", vps }, { "ep", moe and divisors(dp * cp, moe.experts) or { 1 } },
                        { "sp", tp > 1 and { true, false } or { false } },
                        { "dist_opt", dp * cp > 1 and { true, false } or { false } },
                        { "recompute", RECOMPUTE }, { "mbs", mbss },
                    }, function(c)
                        out[#out + 1] = { tp = tp, cp = cp, pp = pp, dp = dp, vp = c.vp,
                                          ep = c.ep, sp = c.sp, dist_opt = c.dist_opt,
                                          recompute = c.recompute, mbs = c.mbs,
                                          nmb = gbs // (c.mbs * dp), bf16 = bf16 }
                    end)
                end
            end
        end
    end
    return out
end

-- A lower bound of the bytes the fullest rank of layout l holds (M.mem_bound): its share of
-- the GEMM weights with their gradients and optimizer state (every parameter lives on some
-- rank of a model replica), and the activations the first stage keeps: of the program's
-- per-layer buffers (program.lua memory_plan) only the layer norms' and residuals' outputs
-- (4 C a token, split by SP), the q|k|v, attention and MLP outputs (split by TP; dropped by
-- the recompute that drops them), for floor(L/PP) layers and min(PP, NMB) micro-batches in
-- flight (one with interleaving).
function M.mem_bound(model, nweights, l, seq)
    local per = nweights / (l.tp * l.pp)
    local A = l.bf16 and 2 or 4
    local state = (l.bf16 and 4 or 0) + 8
    local shard = l.dist_opt and (l.dp * l.cp) or 1
    local params = per * (A + 4 + state / shard)
    local C = model.hidden
    local ffn = model.moe and 0 or model.ffn_hidden
    local sp = l.sp and l.tp or 1
    local per_tok
    if l.recompute == "full" then per_tok = 0
    elseif l.recompute == "selective" then per_tok = 4 * C / sp + (3 * C + 2 * ffn) / l.tp
    else per_tok = 4 * C / sp + (4 * C + 2 * ffn) / l.tp end
    local inflight = l.vp > 1 and 1 or math.min(l.pp, l.nmb)
    local acts = per_tok * A * (l.mbs * seq / l.cp) * (model.layers // l.pp) * inflight
    return params + acts
end

-- The estimate that orders the full evaluations: compute at the GEMM rate (recompute
-- included) stretched by the bubble formula, the TP all-reduces (4 per layer of a
-- micro-batch's activations), the CP ring and the DP gradient all-reduce; a ranking aid, not
-- the prediction.
local function estimate(model, dev, nparams, N, per_node, l, seq)
    local gemm = rates(dev, math.min(per_node, N))
    local tok = l.mbs * seq
    local f = 6 * nparams * tok * l.nmb / (l.tp * l.pp * l.cp)
    if l.recompute == "full" then f = f * 4 / 3 elseif l.recompute == "selective" then
        f = f * 1.03 end
    local bub = (l.pp - 1) / (l.vp * l.nmb)
    local A = l.bf16 and 2 or 4
    local tp_link = l.tp * l.cp > per_node and dev.net or dev.nvlink
    local tpc = l.tp > 1 and 4 * model.layers / l.pp * l.nmb * 2 * tok * model.hidden * A
                / tp_link or 0
    local dpc = l.dp > 1 and 2 * 4 * nparams / (l.tp * l.pp) /
                (N > per_node and dev.net or dev.nvlink) or 0
    if l.dist_opt then dpc = dpc * 0.5 end
    -- the cp ring: K|V forward, K|V and dK|dV backward, each layer and micro-batch
    local cpc = l.cp > 1 and model.layers / l.pp * l.nmb * 8 * tok / l.cp * model.hidden * A
                / (l.tp * l.cp > per_node and dev.net or dev.nvlink) or 0
    return (f / gemm + tpc + cpc) * (1 + bub) + dpc * 0.3
end

-- Memory only grows with the micro-batch, with less recompute, without SP and without the
-- distributed optimizer: the layout of 'failed' (those that did not fit) that l needs at least
-- as much memory as, or nil.
local RC_RANK = { full = 0, selective = 1, none = 2 }
local function dominated(failed, l)
    for _, f in ipairs(failed) do
        local x = f.l
        if x.tp == l.tp and x.pp == l.pp and x.dp == l.dp and x.cp == l.cp and x.vp == l.vp
           and x.ep == l.ep and l.mbs >= x.mbs and RC_RANK[l.recompute] >= RC_RANK[x.recompute]
           and (x.sp or not l.sp) and (x.dist_opt or not l.dist_opt) then
            return f
        end
    end
end

-- The plan: { rows = ranked fitting records, rejected = { {l, why} }, considered, evaluated,
-- skipped = layouts not evaluated (their estimate after the TOP best) }.
function M.plan(model, opts, dev)
    local N = opts.gpus
    local per_node = opts.gpus_per_node or (dev.name == "cpu" and N or 8)
    if N == nil or N < 1 then diag.error(nil, "--plan needs GPUS=N (the number of ranks)") end
    if per_node < 1 then diag.error(nil, "GPUS_PER_NODE must be at least 1") end
    if N > per_node and N % per_node ~= 0 then
        diag.error(nil, "GPUS=%d is not a whole number of nodes of GPUS_PER_NODE=%d: choose a " ..
                   "multiple of %d", N, per_node, per_node)
    end
    local seq = opts.seq or model.seq_len
    local gbs = opts.gbs or M.DEFAULT_GBS_PER_RANK * N
    local bf16 = dev.bf16 or opts.bf16 == true
    -- the parameter count (configure on one rank: the generator's own count)
    local cfg1 = config.configure(model, { model = opts.model, seq = opts.seq, mbs = 1 })
    local s1 = program.sizes(cfg1)
    local f_layer, f_head, f_attn = program.flops_per_token(cfg1, s1)
    local nparams = (model.layers * f_layer + f_head) / 2     -- FLOPs ~ 2 x parameters
    -- attention's FLOPs are no parameters: the bound counts the GEMM weights only
    local nweights = (model.layers * (f_layer - f_attn) + f_head) / 2
    local cands = M.candidates(model, N, per_node, gbs, bf16, opts.mbs)
    if #cands == 0 then
        diag.error(nil, "no layout of GPUS=%d ranks divides GBS=%d (GBS must be a multiple of " ..
                   "MBS x DP for some DP dividing %d)", N, gbs, N)
    end
    -- sizes the user fixed (make plan TP=8 ...) narrow the enumeration
    local kept = {}
    for _, l in ipairs(cands) do
        local ok = true
        for _, k in ipairs({ "tp", "pp", "dp", "cp", "vp", "ep", "mbs" }) do
            if opts[k] and l[k] ~= opts[k] then ok = false end
        end
        if opts.sp and not l.sp then ok = false end
        if opts.dist_opt and not l.dist_opt then ok = false end
        if opts.recompute and l.recompute ~= opts.recompute then ok = false end
        if ok then kept[#kept + 1] = l end
    end
    if #kept == 0 then
        diag.error(nil, "no layout of GPUS=%d ranks has the sizes given (TP x PP x DP x CP " ..
                   "must be %d, GBS a multiple of MBS x DP)", N, N)
    end
    cands = kept
    local rejected, valid = {}, {}
    local cap = dev.name == "cpu" and dev.node_mem / math.min(per_node, N) or dev.mem
    for _, l in ipairs(cands) do
        l.seq = opts.seq
        local lb = M.mem_bound(model, nweights, l, seq)
        local cfg, why = passes(model, layout_opts(opts, l))
        if not cfg then
            rejected[#rejected + 1] = { l = l, why = why }
        elseif lb > cap then
            rejected[#rejected + 1] = { l = l, why = string.format("parameters, optimizer state " ..
                "and the activations kept need at least %.1f GiB > %.1f GiB", lb / GIB,
                cap / GIB), bytes = lb }
        else
            l.cfg, l.est = cfg, estimate(model, dev, nparams, N, per_node, l, seq)
            valid[#valid + 1] = l
        end
    end
    table.sort(valid, function(a, b) return a.est < b.est end)
    local rows, evaluated, skipped, capped, failed = {}, 0, {}, false, {}
    local top = opts.top or M.TOP
    for i, l in ipairs(valid) do
        local enough = #rows >= top and l.est > rows[top].step
        local cap_evals = #rows > 0 and M.FULL_EVALS or M.MAX_FULL_EVALS
        if enough or evaluated >= cap_evals then
            for j = i, #valid do skipped[#skipped + 1] = valid[j] end
            capped = not enough
            break
        end
        local by = dominated(failed, l)
        if by then
            rejected[#rejected + 1] = { l = l, why = string.format("needs at least the memory " ..
                "of %s (larger micro-batches, less recompute, no SP or distributed optimizer " ..
                "where it has them): %s", M.layout_text(by.l), by.why) }
        else
            evaluated = evaluated + 1
            local rec, why, peak = M.evaluate(l.cfg, dev, per_node)
            if rec then
                rec.l = l
                rows[#rows + 1] = rec
                table.sort(rows, function(a, b) return a.step < b.step end)
            else
                rejected[#rejected + 1] = { l = l, why = why }
                if peak then failed[#failed + 1] = { l = l, why = why } end
            end
        end
    end
    -- the recommended layout's program through the verifier too (program.check), as the
    -- generator runs it: a layout it would refuse is dropped
    while rows[1] do
        local rec, why = M.evaluate(rows[1].cfg, dev, per_node, true)
        if rec then break end
        rejected[#rejected + 1] = { l = rows[1].l, why = why }
        table.remove(rows, 1)
    end
    return { rows = rows, rejected = rejected, considered = #cands, evaluated = evaluated,
             skipped = skipped, capped = capped, nweights = nweights, gbs = gbs, seq = seq,
             N = N, per_node = per_node }
end

-- -- The report ---------------------------------------------------------------------------------

local function comm_text(rec)
    local w = {}
    for _, c in ipairs(rec.comm) do
        w[#w + 1] = string.format("%s %s%s", c.kind, util.bytes(math.floor(c.bytes)),
                                  c.inter and " net" or "")
    end
    return #w > 0 and table.concat(w, ", ") or "-"
end

-- The report of M.plan as text.
function M.report(model, opts, dev, p)
    local out = {}
    local node_text = p.N > p.per_node and string.format("%d nodes of %d", p.N // p.per_node,
                                                         p.per_node)
                      or string.format("one node of %d", p.per_node)
    out[#out + 1] = string.format("plan: %s on %d x %s (%s), %.1f GiB each; GBS %d, seq %d",
                                  model.name, p.N, dev.text, node_text,
                                  (dev.name == "cpu" and dev.node_mem / math.min(p.N, p.per_node)
                                   or dev.mem) / GIB, p.gbs, p.seq)
    out[#out + 1] = string.format("  %d layouts considered, %d rejected without a full " ..
                                  "evaluation, %d evaluated in full, %d fit; %d not evaluated (%s)",
                                  p.considered, p.considered - p.evaluated - #p.skipped,
                                  p.evaluated, #p.rows, #p.skipped, p.capped and
                                  "the cap on full evaluations was reached"
                                  or string.format("estimated slower than the %d best",
                                                   opts.top or M.TOP))
    out[#out + 1] = string.format("  rates: GEMM %.3g TFLOP/s, memory %.3g TB/s, %s %.3g GB/s, " ..
                                  "network %.3g GB/s per rank (docs/PLAN.md)", dev.gemm / 1e12,
                                  dev.bw / 1e12, dev.name == "cpu" and "MPI shared memory"
                                  or "NVLink", dev.nvlink / 1e9, dev.net / 1e9)
    out[#out + 1] = ""
    if #p.rows == 0 then
        local best
        for _, r in ipairs(p.rejected) do
            local b = r.why:match("needs ([%d.]+) GiB") or r.why:match("at least ([%d.]+) GiB")
            if b and (not best or tonumber(b) < best.b) then best = { b = tonumber(b), r = r } end
        end
        if best then
            diag.error(nil, "no layout of %s on %d ranks fits %.1f GiB per rank: the smallest " ..
                       "plan found needs %.1f GiB (%s: %s); give more GPUS, a larger GPU_MEM, " ..
                       "or a smaller GBS/SEQ", model.name, p.N,
                       (dev.name == "cpu" and dev.node_mem / math.min(p.N, p.per_node) or dev.mem)
                       / GIB, best.b, M.layout_text(best.r.l), best.r.why)
        end
        local why = p.rejected[1] and p.rejected[1].why or "no candidate"
        diag.error(nil, "no valid layout of %s on GPUS=%d: %s (make plan ... WHY=1 lists every " ..
                   "layout's reason)", model.name, p.N, why)
    end
    local rows = { { "#", "layout", "nmb", "mem/rank", "bubble", "communication per step",
                     "ms/step", "tokens/s", "MFU" } }
    for i = 1, math.min(#p.rows, opts.top or M.TOP) do
        local r = p.rows[i]
        rows[#rows + 1] = { tostring(i), M.layout_text(r.l), tostring(r.l.nmb),
                            util.bytes(math.floor(r.peak)),
                            string.format("%.1f%%", 100 * r.bubble), comm_text(r),
                            string.format("%.1f", 1e3 * r.step),
                            util.thousands(math.floor(r.tokens + 0.5)),
                            string.format("%.1f%%", 100 * r.mfu) }
    end
    for _, line in ipairs(util.columns(rows, "rllrrlrrr")) do out[#out + 1] = line end
    out[#out + 1] = ""
    out[#out + 1] = "  (mem/rank: the largest stage's plan with the runtime's workspaces and " ..
                    "NCCL's buffers; communication: bytes a rank sends per step by group, the " ..
                    "busiest stage's, " ..
                    "net = between nodes)"
    local best = p.rows[1]
    out[#out + 1] = "best: " .. M.make_command(model.name, best.l)
    if opts.verbose then
        out[#out + 1] = ""
        out[#out + 1] = string.format("rejected (%d):", #p.rejected)
        for _, r in ipairs(p.rejected) do
            out[#out + 1] = string.format("  %s nmb %d: %s", M.layout_text(r.l), r.l.nmb, r.why)
        end
        if #p.skipped > 0 then
            out[#out + 1] = string.format("not evaluated (%d, %s):", #p.skipped, p.capped and
                                          "after the cap on full evaluations" or
                                          string.format("estimated slower than the best %d",
                                                        opts.top or M.TOP))
            for _, l in ipairs(p.skipped) do
                out[#out + 1] = string.format("  %s nmb %d: estimate %.1f ms", M.layout_text(l),
                                              l.nmb, 1e3 * l.est)
            end
        end
    end
    out[#out + 1] = ""
    return table.concat(out, "\n")
end

return M
