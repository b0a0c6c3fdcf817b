-- inspect.lua: the human-readable reports, as text (at most 100 columns).
-- inspect.rank(cfg, topo, part, sh, r): everything about one rank (--inspect --rank R).
-- inspect.summary(cfg, topo, part, sh): all ranks by stage plus totals (--inspect, report.txt);
-- for worlds above ROWS_MAX ranks one row per stage with its rank ranges.
-- Pure (returns strings); driver.lua prints them, emit.lua writes report.txt.

local partition = require("partition")
local program = require("program")
local schedule = require("schedule")
local shards = require("shards")
local svg = require("svg")
local topology = require("topology")
local util = require("util")

local M = {}

M.ROWS_MAX = 128        -- above this many ranks the summary lists stages, not ranks

local function header(cfg)
    local m = cfg.model
    local lines = {
        string.format("%s (%s): %s", m.name, m.file, m.description or "GPT"),
        string.format("layout    tp%d pp%d dp%d cp%d ep%d etp%d edp%d vp%d: world %d, order %s",
                      cfg.tp, cfg.pp, cfg.dp, cfg.cp, cfg.ep, cfg.etp, cfg.edp, cfg.vp,
                      cfg.world, cfg.order),
        string.format("model     %d layers, hidden %d, %d heads, seq_len %d, vocab %d " ..
                      "(padded to %d), ffn %d", m.layers, m.hidden, m.heads, m.seq_len, m.vocab,
                      cfg.vocab_padded, m.ffn_hidden),
    }
    if m.arch == "llama" then
        lines[#lines + 1] = string.format("llama     RMSNorm eps %g, SwiGLU, rotary positions " ..
                                          "(theta %g), %d kv heads (%s), no biases, %s LM head",
                                          m.norm_eps, m.rope_theta, m.kv_heads,
                                          m.kv_heads == m.heads and "multi-head attention" or
                                          string.format("grouped-query: %d query heads each",
                                                        m.heads // m.kv_heads),
                                          m.tie_embeddings and "tied" or "untied")
    end
    if m.moe then
        lines[#lines + 1] = string.format("moe       %d experts, top %d, expert ffn %d, %s%s",
                                          m.moe.experts, m.moe.top_k, m.moe.ffn_hidden,
                                          m.moe.bias and "with biases" or "no biases",
                                          m.moe.shared_expert_ffn and string.format(
                                              ", shared expert ffn %d",
                                              m.moe.shared_expert_ffn) or "")
    end
    lines[#lines + 1] = string.format("training  mbs %d, nmb %d, seq %d, sp %s, " ..
                                      "distributed optimizer %s", cfg.mbs, cfg.nmb, cfg.seq,
                                      cfg.sp and "on" or "off", cfg.dist_opt and "on" or "off")
    local uneven = {}
    if cfg.first_layers then uneven[1] = string.format("first stage %d", cfg.first_layers) end
    if cfg.last_layers then
        uneven[#uneven + 1] = string.format("last stage %d", cfg.last_layers)
    end
    if #uneven > 0 then
        lines[#lines + 1] = "uneven    layers on the " .. table.concat(uneven, ", ")
    end
    if cfg.account_embedding or cfg.account_loss then
        local w = {}
        if cfg.account_embedding then w[1] = "the embedding" end
        if cfg.account_loss then w[#w + 1] = "the loss" end
        lines[#lines + 1] = "split     even, counting " .. table.concat(w, " and ") ..
                            " as a layer (Megatron's account_for_*_in_pipeline_split)"
    end
    if cfg.layout then
        local stages, w = partition.parse_layout(cfg.layout), {}
        for i, st in ipairs(stages) do
            w[i] = string.format("%d.%d %s", (i - 1) % cfg.pp, (i - 1) // cfg.pp,
                                 partition.stage_text(st))
        end
        lines[#lines + 1] = string.format("placement '%s': pp.chunk %s", cfg.layout,
                                          table.concat(w, ", "))
    end
    return lines
end

local function chunks_text(stage)
    local parts = {}
    for _, c in ipairs(stage.chunks) do
        parts[#parts + 1] = (#stage.chunks > 1 and (c.vp .. ":") or "") .. partition.range_text(c)
    end
    return table.concat(parts, " ")
end

local function duties(stage, P, tied)
    local d = {}
    for _, c in ipairs(stage.chunks) do
        if c.embedding then d[#d + 1] = "embedding" end
        if c.head then
            d[#d + 1] = not tied and "head+loss (lm_head)" or (P > 1) and "head+loss (tied wte)"
                        or "head+loss"
        end
    end
    return #d > 0 and table.concat(d, ", ") or "-"
end

-- One class of each stage (the classes of a stage hold equal amounts: every TP rank has the
-- same local shapes, padding included, and every EP rank as many experts).
local function stage_class(sh)
    local first = {}
    for _, c in ipairs(sh.classes) do
        if not first[c.pp] then first[c.pp] = c end
    end
    return first
end

-- Memory of each stage's ranks for every dtype, with or without the distributed optimizer.
local function memory_table(cfg, sh, dist_opt)
    local rows = { { "stage" } }
    for _, d in ipairs(sh.dtypes) do rows[1][#rows[1] + 1] = d.label end
    local first = stage_class(sh)
    for p = 0, cfg.pp - 1 do
        local row = { tostring(p) }
        for _, d in ipairs(sh.dtypes) do
            row[#row + 1] = util.bytes(shards.bytes_of(first[p], d.name, dist_opt).total)
        end
        rows[#rows + 1] = row
    end
    return util.columns(rows, "rrrr")
end

function M.summary(cfg, topo, part, sh, sched, prog)
    local out = header(cfg)
    out[#out + 1] = string.format("params    %s unique (%s in experts); %s held over all ranks",
                                  util.thousands(sh.unique), util.thousands(sh.unique_expert),
                                  util.thousands(sh.held))
    out[#out + 1] = ""
    local P = cfg.pp
    local s_pp = topology.axis_stride(topo.dense, "pp")
    local function stage_ranks(p)      -- ascending (small worlds only)
        local ranks = {}
        for r = 0, cfg.world - 1 do
            if (r // s_pp) % P == p then ranks[#ranks + 1] = r end
        end
        return ranks
    end
    if cfg.world <= M.ROWS_MAX then
        out[#out + 1] = "ranks by stage"
        local rows = { { "rank", "pp", "tp", "cp", "dp", "etp", "ep", "edp", "layers", "duties",
                         "params/rank" } }
        for p = 0, P - 1 do
            local st = part.stages[p + 1]
            for _, r in ipairs(stage_ranks(p)) do
                local c = topology.coords(topo, r)
                rows[#rows + 1] = { tostring(r), tostring(p), tostring(c.tp), tostring(c.cp),
                                    tostring(c.dp), tostring(c.etp), tostring(c.ep),
                                    tostring(c.edp), chunks_text(st),
                                    duties(st, P, cfg.model.tie_embeddings),
                                    util.thousands(shards.class_of(sh, r).numel) }
            end
        end
        for _, line in ipairs(util.columns(rows, "rrrrrrrrllr")) do out[#out + 1] = line end
    else
        out[#out + 1] = "stages"
        local rows = { { "stage", "ranks", "layers", "duties", "params/rank" } }
        local first = stage_class(sh)
        for p = 0, P - 1 do
            local st = part.stages[p + 1]
            rows[#rows + 1] = { tostring(p), topology.stage_ranks_text(topo, p, 36) ..
                                string.format(" (%d)", topology.stage_size(topo)),
                                chunks_text(st), duties(st, P, cfg.model.tie_embeddings),
                                util.thousands(first[p].numel) }
        end
        for _, line in ipairs(util.columns(rows, "rlllr")) do out[#out + 1] = line end
    end
    for _, dist in ipairs({ false, true }) do
        out[#out + 1] = ""
        if dist then
            local experts = cfg.model.moe and
                            string.format("; experts over expt-dp = %d", cfg.edp) or ""
            out[#out + 1] = string.format("memory per rank, distributed optimizer (state " ..
                                          "sharded over dp-cp = %d%s)", cfg.dp * cfg.cp, experts)
        else
            out[#out + 1] = "memory per rank: params + grads + optimizer state, no distributed " ..
                            "optimizer"
        end
        for _, line in ipairs(memory_table(cfg, sh, dist)) do out[#out + 1] = line end
    end
    M.cp_summary(cfg, out)
    M.pipeline_summary(cfg, part, sched, prog, out)
    out[#out + 1] = ""
    return table.concat(out, "\n")
end

-- Append the context-parallel lines of the summary to 'out' (CP > 1 only).
function M.cp_summary(cfg, out)
    local t = M.cp_traffic(cfg)
    if not t then return end
    local tc = cfg.seq // (2 * cfg.cp)
    out[#out + 1] = ""
    out[#out + 1] = string.format("context parallelism: CP %d, %s; each cp rank holds 2 chunks " ..
                                  "of %d positions", cfg.cp, t.a2a and "all-to-all (CP_COMM=a2a)"
                                  or "p2p ring (CP_COMM=p2p)", tc)
    out[#out + 1] = string.format("  per attention layer and micro-batch, a rank sends %s " ..
                                  "forward and %s backward", util.bytes(t.forward),
                                  util.bytes(t.backward))
    out[#out + 1] = "  (make inspect RANK=r: a rank's chunks, neighbours and buffers)"
end

-- -- One rank --------------------------------------------------------------------------------

local function slice_text(piece, shape)
    local dims = {}
    for d = 1, #shape do
        if piece.start[d] == 0 and piece.size[d] == shape[d] then
            dims[d] = ":"
        else
            dims[d] = string.format("%d:%d", piece.start[d], piece.start[d] + piece.size[d])
        end
    end
    return "[" .. table.concat(dims, ", ") .. "]"
end

-- What a param's pieces cover, as slice texts: "all", "padding only", or "[a:b, :]"...
local function holds(p)
    if #p.pieces == 0 then return { "padding only" } end
    local whole = #p.pieces == 1
    for d = 1, #p.shape do
        whole = whole and p.pieces[1].start[d] == 0 and p.pieces[1].size[d] == p.shape[d]
    end
    if whole then return { "all" } end
    local out = {}
    for i, piece in ipairs(p.pieces) do out[i] = slice_text(piece, p.shape) end
    return out
end

function M.rank(cfg, topo, part, sh, sched, prog, r)
    local out = header(cfg)
    local c = topology.coords(topo, r)
    local P = cfg.pp
    out[#out + 1] = ""
    out[#out + 1] = string.format("rank %d of %d", r, cfg.world)
    out[#out + 1] = string.format("  attention grid  tp %d  cp %d  dp %d  pp %d",
                                  c.tp, c.cp, c.dp, c.pp)
    out[#out + 1] = string.format("  expert grid     etp %d  ep %d  edp %d  pp %d",
                                  c.etp, c.ep, c.edp, c.pp)
    local prev, nxt = topology.neighbours(topo, r)
    out[#out + 1] = string.format("  pipeline        stage %d of %d; prev rank %d, next rank %d%s",
                                  c.pp, P, prev, nxt, P > 1 and " (wrapping)" or "")
    local st = part.stages[c.pp + 1]
    for _, ch in ipairs(st.chunks) do
        local duty = {}
        local llama = cfg.model.arch == "llama"
        if ch.embedding then
            duty[#duty + 1] = llama and "embedding (embed_tokens)" or "embedding (wte, wpe)"
        end
        if ch.head then
            duty[#duty + 1] = not cfg.model.tie_embeddings and "norm, LM head (lm_head), loss"
                              or (P > 1) and "ln_f, LM head (tied wte copy), loss"
                              or "ln_f, LM head (wte), loss"
        end
        out[#out + 1] = string.format("  chunk %d         layers %s (%d)%s", ch.vp,
                                      partition.range_text(ch), ch.count,
                                      #duty > 0 and ("; " .. table.concat(duty, "; ")) or "")
    end

    out[#out + 1] = ""
    out[#out + 1] = "groups"
    local rows = { { "kind", "size", "group", "index", "members" } }
    for _, kind in ipairs(topo.kinds) do
        local g, pos = topology.group_of(topo, kind.name, r)
        if g then
            rows[#rows + 1] = { kind.name, tostring(kind.size), tostring(g), tostring(pos),
                                util.ranks(topology.members(kind, g), 1, kind.size, 60) }
        else
            rows[#rows + 1] = { kind.name, "-", "-", "-", "not a member (" ..
                                (kind.name == "embd" and "not the first or last stage"
                                 or "not the first stage") .. ")" }
        end
    end
    for _, line in ipairs(util.columns(rows, "lrrrl")) do out[#out + 1] = "  " .. line end

    local cls = shards.class_of(sh, r)
    out[#out + 1] = ""
    out[#out + 1] = string.format("parameters: %d tensors, %s elements on this rank",
                                  #cls.params, util.thousands(cls.numel))
    out[#out + 1] = "  (tp: split = TP-sharded; copy = replica counted in the grad norm; " ..
                    "dup = replica left out)"
    rows = { { "name", "global", "local", "tp", "reduce" } }
    local held = {}
    for _, p in ipairs(cls.params) do
        rows[#rows + 1] = { p.name .. (p.tied and " (tied)" or ""), util.shape(p.shape),
                            util.shape(p.local_shape),
                            p.tp_sharded and "split" or (p.tp_duplicate and "dup" or "copy"),
                            table.concat(p.reduce, ",") }
        held[#rows] = holds(p)
    end
    -- "holds" is the last column, its pieces wrapping within 100 columns; when the other
    -- columns leave too little room, the pieces go on lines of their own below each row.
    local lines = util.columns(rows, "lrrll")
    local used = 0
    for _, line in ipairs(lines) do used = math.max(used, #line + 4) end
    local below = 100 - used < 24
    local col = below and 10 or used
    for i, line in ipairs(lines) do
        local packed, cur = {}, nil
        for _, h in ipairs(held[i] or {}) do
            if cur and #cur + 1 + #h <= 100 - col then
                cur = cur .. " " .. h
            else
                if cur then packed[#packed + 1] = cur end
                cur = h
            end
        end
        packed[#packed + 1] = cur
        local row = "  " .. line
        if i == 1 then
            out[#out + 1] = below and row or (row .. string.rep(" ", col - #row) .. "holds")
        elseif below then
            out[#out + 1] = row
            for k, text in ipairs(packed) do
                out[#out + 1] = (k == 1 and "    holds " or string.rep(" ", col)) .. text
            end
        else
            out[#out + 1] = row .. string.rep(" ", col - #row) .. (packed[1] or "")
            for k = 2, #packed do out[#out + 1] = string.rep(" ", col) .. packed[k] end
        end
    end

    out[#out + 1] = ""
    out[#out + 1] = "memory on this rank"
    rows = { { "", "params", "grads", "optimizer", "total" } }
    for _, dist in ipairs({ false, true }) do
        rows[#rows + 1] = { dist and "distributed optimizer:" or "no distributed optimizer:",
                            "", "", "", "" }
        for _, d in ipairs(sh.dtypes) do
            local b = shards.bytes_of(cls, d.name, dist)
            rows[#rows + 1] = { "  " .. d.label, util.bytes(b.params), util.bytes(b.grads),
                                util.bytes(b.optim), util.bytes(b.total) }
        end
    end
    for _, line in ipairs(util.columns(rows, "lrrrr")) do out[#out + 1] = "  " .. line end
    M.distopt_rank(cfg, topo, sh, prog, r, out)
    M.moe_rank(cfg, topo, part, sh, r, out)
    M.cp_rank(cfg, topo, part, prog, r, out)
    M.pipeline_rank(cfg, topo, part, sched, prog, r, out)
    out[#out + 1] = ""
    return table.concat(out, "\n")
end

-- -- Pipeline: schedule, in-flight micro-batches, activation memory, bubble ---------

-- The bubble fraction the schedule predicts (docs/megatron.md §3): value and text.
function M.pipeline_bubble(cfg)
    local P, V, Mb = cfg.pp, cfg.vp, cfg.nmb
    if P == 1 then return 0.0, "none (one stage)" end
    if V == 1 then
        local b = (P - 1) / Mb
        return b, string.format("(P-1)/M = %d/%d = %.3f", P - 1, Mb, b)
    end
    local b = (P - 1) / (V * Mb)
    return b, string.format("(P-1)/(V*M) = %d/%d = %.3f", P - 1, V * Mb, b)
end

-- The schedule and what it costs on every stage: {sched, kind, timeline, bubble (formula),
-- bubble_text, stages = {[r] = {warmup, steady, cooldown, inflight, slots = {}, bytes = {},
-- pool, pool_bytes, peak, slot_of}}}. Slots and bytes are the program's (program.build, what
-- the library allocates): each chunk's, or (pool > 0) one pool of slots the chunks share;
-- without a program (a layout it does not support) bytes and peak are nil.
function M.pipeline(cfg, sched, prog)
    local P, V = cfg.pp, cfg.vp
    local out = { sched = sched, kind = sched.kind, stages = {},
                  timeline = svg.timeline(sched) }
    out.bubble, out.bubble_text = M.pipeline_bubble(cfg)
    for r = 0, P - 1 do
        local st = sched.stages[r + 1]
        local sp = prog and prog.stages[r + 1]
        local pool = sp and sp.pool_slots or 0
        local slots = schedule.assign_slots(st, V, pool > 0)
        local rec = { warmup = st.warmup, steady = st.steady, cooldown = st.cooldown,
                      inflight = slots.inflight, slots = {}, bytes = {}, peak = nil,
                      pool = pool, pool_bytes = sp and sp.pool_slot_bytes or 0,
                      slot_of = slots.slot }
        for v = 0, V - 1 do rec.slots[v + 1] = slots.nslots[v] end
        if sp then
            rec.grads, rec.grad_bytes = sp.grad_buffers, M.grad_bytes(sp)
            rec.peak = pool * rec.pool_bytes + rec.grads * rec.grad_bytes
            for i, ch in ipairs(sp.chunks) do
                assert(ch.slots == rec.slots[i], "inspect: slots differ from the program's")
                rec.bytes[i] = ch.slot_bytes
                if pool == 0 then rec.peak = rec.peak + ch.slots * ch.slot_bytes end
            end
        end
        out.stages[r] = rec
    end
    return out
end

M.KIND_TEXT = { none = "no pipelining (gradient accumulation)", ["1f1b"] = "1F1B",
                interleaved = "interleaved 1F1B" }

-- "1F1B, 8 micro-batches of 2": the schedule's kind, micro-batch count and size.
function M.schedule_text(cfg, kind)
    local t = M.KIND_TEXT[kind]
    if kind == "interleaved" then
        t = t .. string.format(" over %d chunks", cfg.vp)
        if cfg.mb_group ~= cfg.pp then
            t = t .. string.format(" in micro-batch groups of %d", cfg.mb_group)
        end
    end
    return string.format("%s, %d micro-batch%s of %d", t, cfg.nmb, cfg.nmb == 1 and "" or "es",
                         cfg.mbs)
end

-- The bytes of one of a stage's gradient buffers (its C_DY entry's instance).
function M.grad_bytes(sp)
    for _, m in ipairs(sp.mem) do
        if m.id == "C_DY" then return m.instance end
    end
    return 0
end

-- Append the pipeline section of the summary to 'out'.
function M.pipeline_summary(cfg, part, sched, prog, out)
    local pl = M.pipeline(cfg, sched, prog)
    local tl = pl.timeline
    out[#out + 1] = ""
    out[#out + 1] = "pipeline schedule: " .. M.schedule_text(cfg, pl.kind)
    out[#out + 1] = "  bubble     " .. pl.bubble_text
    out[#out + 1] = string.format("  simulated  %.3f: makespan %d units for %d of compute per " ..
                                  "stage (units: F 1, B 2, p2p 0)", svg.bubble(tl),
                                  tl.makespan, tl.busy)
    local rows = { { "stage", "warm-up", "steady", "cool-down", "in flight", "slots",
                     "bytes/slot", "grads", "peak activations" } }
    for r = 0, cfg.pp - 1 do
        local s = pl.stages[r]
        local slots, bytes = {}, {}
        for i, n in ipairs(s.slots) do
            slots[i] = tostring(n)
            bytes[i] = s.bytes[i] and util.bytes(s.bytes[i]) or "-"
        end
        local slots_text, bytes_text = table.concat(slots, "+"), table.concat(bytes, " + ")
        if s.pool > 0 then
            slots_text, bytes_text = s.pool .. " shared", util.bytes(s.pool_bytes)
        end
        rows[#rows + 1] = { tostring(r), tostring(s.warmup), tostring(s.steady),
                            tostring(s.cooldown), tostring(s.inflight), slots_text,
                            s.peak and bytes_text or "-",
                            s.peak and string.format("%d x %s", s.grads,
                                                     util.bytes(s.grad_bytes)) or "-",
                            s.peak and util.bytes(s.peak) or "-" }
    end
    for _, line in ipairs(util.columns(rows, "rrrrrrlrr")) do out[#out + 1] = "  " .. line end
    out[#out + 1] = "  (slots: activation buffers of each chunk, one per micro-batch in flight; " ..
                    "peak: slots + grads)"
    out[#out + 1] = "  (grads: buffers for the gradients of the stage's outputs, each held " ..
                    "until its input's is sent)"
    if cfg.vp > 1 then
        out[#out + 1] = "  (shared: the chunks draw their slots from one pool, as many as " ..
                        "micro-batches in flight)"
    end
    if not prog then
        out[#out + 1] = "  (activation bytes: no training program for this layout yet)"
        return
    end
    M.memory_plan(cfg, prog, out)
end

-- NCCL's own buffers, which the program cannot count (NCCL allocates them inside): an
-- estimate per communicator a rank belongs to, of NCCL_BUFFSIZE (4 MiB, NCCL's default) for
-- each of its 2 ring neighbours on each of 8 channels (docs/PROGRAM.md §5).
M.NCCL_BYTES_PER_COMM = 2 * 8 * (4 << 20)

-- The device memory of every stage as the program allocates it (program.build's plan, which
-- the library checks at start) and, on the GPU, what the runtime and NCCL add: per stage
-- { stage, ranks, parameters, main_parameters, gradients, optimizer_state, activations =
-- { per_slot = {per chunk}, slots = {per chunk}, bytes, pool, pool_bytes (pool > 0: the
-- chunks share that many slots of pool_bytes) }, recompute_workspace,
-- communication, workspace, peak_bytes (= the allocated total on the CPU), cuda = {
-- cublas_workspace, gemm_staging, nccl_communicators, nccl_estimate, allocated, peak_bytes } }.
function M.memory(cfg, prog)
    local comms = 1                                     -- the world
    for _, g in ipairs(prog.groups) do
        if g.create then comms = comms + 1 end
    end
    local out = {}
    for _, sp in ipairs(prog.stages) do
        local per_slot, slots = {}, {}
        local acts = sp.pool_slots * sp.pool_slot_bytes + sp.grad_buffers * M.grad_bytes(sp)
        for i, c in ipairs(sp.chunks) do
            per_slot[i], slots[i] = c.slot_bytes, c.slots
            if sp.pool_slots == 0 then acts = acts + c.slots * c.slot_bytes end
        end
        local by = { activations = 0, communication = 0, workspace = 0 }
        local work = 0
        for _, m in ipairs(sp.mem) do
            by[m.category] = by[m.category] + m.bytes - m.work_bytes
            work = work + m.work_bytes
        end
        assert(by.activations == acts, "inspect: activation bytes differ from the slots'")
        local cuda_alloc = sp.mem_bytes + program.CUDA_WORKSPACE_BYTES + program.CUDA_STAGE_BYTES
        local nccl = comms * M.NCCL_BYTES_PER_COMM
        out[#out + 1] = {
            stage = sp.stage, ranks = sp.ranks, parameters = sp.params.params,
            main_parameters = sp.params.main, gradients = sp.params.grads,
            optimizer_state = sp.params.moments,
            activations = { per_slot = per_slot, slots = slots, bytes = acts,
                            pool = sp.pool_slots, pool_bytes = sp.pool_slot_bytes,
                            grads = sp.grad_buffers, grad_bytes = M.grad_bytes(sp) },
            recompute_workspace = work, communication = by.communication,
            workspace = by.workspace, peak_bytes = sp.mem_bytes,
            cuda = { cublas_workspace = program.CUDA_WORKSPACE_BYTES,
                     gemm_staging = program.CUDA_STAGE_BYTES, allocated = cuda_alloc,
                     nccl_communicators = comms, nccl_estimate = nccl,
                     peak_bytes = cuda_alloc + nccl },
        }
    end
    return out
end

-- What the program is built for, in words: "bf16, selective recompute (core_attn)".
function M.precision_text(cfg)
    local t = cfg.bf16 and "bf16 (f32 main parameters and gradients)" or "f32"
    if cfg.recompute == "full" then
        t = t .. string.format(", full recompute (%s, %d)", cfg.recompute_method,
                               cfg.recompute_layers)
    elseif cfg.recompute == "selective" then
        t = t .. ", selective recompute (" .. table.concat(cfg.recompute_modules, ", ") .. ")"
    end
    return t
end

-- Append the program's device memory per rank of each stage (M.memory) to 'out'.
function M.memory_plan(cfg, prog, out)
    local mem = M.memory(cfg, prog)
    out[#out + 1] = ""
    out[#out + 1] = "device memory per rank, as the program allocates it (" ..
                    M.precision_text(cfg) .. "; checked at start)"
    local has_main, has_work = cfg.bf16, cfg.recompute ~= "none"
    local head = { "stage", "params" }
    if has_main then head[#head + 1] = "main params" end
    for _, h in ipairs({ "grads", "moments", "activations" }) do head[#head + 1] = h end
    if has_work then head[#head + 1] = "recompute" end
    for _, h in ipairs({ "comm", "workspace", "CPU total", "GPU total" }) do
        head[#head + 1] = h
    end
    local rows = { head }
    for _, m in ipairs(mem) do
        local row = { tostring(m.stage), util.bytes(m.parameters) }
        if has_main then row[#row + 1] = util.bytes(m.main_parameters) end
        row[#row + 1] = util.bytes(m.gradients)
        row[#row + 1] = util.bytes(m.optimizer_state)
        row[#row + 1] = util.bytes(m.activations.bytes)
        if has_work then row[#row + 1] = util.bytes(m.recompute_workspace) end
        row[#row + 1] = util.bytes(m.communication)
        row[#row + 1] = util.bytes(m.workspace)
        row[#row + 1] = util.bytes(m.peak_bytes)
        row[#row + 1] = util.bytes(m.cuda.peak_bytes)
        rows[#rows + 1] = row
    end
    for _, line in ipairs(util.columns(rows, string.rep("r", #head))) do
        out[#out + 1] = "  " .. line
    end
    local c = mem[1].cuda
    out[#out + 1] = string.format("  (GPU total: the CPU total + the cuBLAS workspace %s + the " ..
                                  "GEMM staging %s + NCCL's buffers, estimated %s for %d " ..
                                  "communicators)", util.bytes(c.cublas_workspace),
                                  util.bytes(c.gemm_staging), util.bytes(c.nccl_estimate),
                                  c.nccl_communicators)
end

-- What the rank does for one step, with concrete peer ranks.
local function step_text(cfg, stage, ch_of, s, slot_of, prev, nxt)
    if s.kind == "F" or s.kind == "B" then
        local ch = ch_of[s.chunk]
        local last = ch.first + ch.count - 1
        local layers = ch.count == 1 and ("layer " .. ch.first)
            or (s.kind == "F" and string.format("layers %d..%d", ch.first, last)
                or string.format("layers %d..%d", last, ch.first))
        local what = layers
        if s.kind == "F" then
            if ch.embedding then what = "embedding, " .. what end
            if ch.head then what = what .. ", head + loss" end
        elseif ch.embedding then
            what = what .. ", embedding"
        end
        return { string.format("%s mb %d (chunk %d, slot %d): %s",
                               s.kind == "F" and "forward " or "backward", s.mb, s.chunk,
                               slot_of[s.mb .. "." .. s.chunk], what) }
    end
    local parts = {}
    for _, op in ipairs(s.ops) do
        local peer = op.dir == "next" and nxt or prev
        local where = ""
        if cfg.vp > 1 then
            -- the tensor's chunk here, and on the peer when it differs (the wrap-around)
            local v = op.chunk * cfg.pp + stage
            local step = (op.what == "act") == op.send and 1 or -1
            local theirs = (v + step) // cfg.pp
            where = " chunk " .. op.chunk .. (theirs ~= op.chunk and
                string.format(" (its chunk %d there)", theirs) or "")
        end
        parts[#parts + 1] = string.format("%s %s mb %d%s %s rank %d",
            op.send and "send" or "recv", op.what == "act" and "activations" or "gradient",
            op.mb, where, op.send and "to" or "from", peer)
    end
    return parts
end

-- What each tail op's collective carries (program.lua tail_ops).
local TAIL_WHAT = {
    SP_ALLREDUCE = "sequence-parallel gradients", EMBD_ALLREDUCE = "the tied wte gradient",
    DP_REDUCE = "gradients (one bucket)",
    NORM_ALLREDUCE = "the gradient norm", PARAM_ALLGATHER = "updated parameters (one bucket)",
    EXPERT_BIAS = "the step's rows per expert (expert bias)",
    AUX_ALLREDUCE = "the step's aux loss", LOSS_ALLREDUCE = "the step's loss",
}

local OP_TEXT = { allreduce = "all-reduce", allgather = "all-gather",
                  reduce_scatter = "reduce-scatter", alltoallv = "all-to-all" }

-- "kind [members]" of the group of rank r.
local function group_text(topo, kind_name, r)
    local g = topology.group_of(topo, kind_name, r)
    local kind = topology.kind(topo, kind_name)
    return string.format("%s [%s]", kind_name, util.ranks(topology.members(kind, g), 1,
                                                          kind.size, 40))
end

--[[
** The data-parallel collectives each stage keeps in flight (overlap.lua's plan), for the
** communication lanes of schedule.svg and make inspect RANK=: per stage (0-based) a list of
** { kind = "reduce" | "gather", op = AsyncOp, at = { kind = "F" | "B", mb, chunk, frac,
** call } }: a reduction starts at 'at' (after the call: frac of the op's calls done) and is
** waited after the schedule; an all-gather starts after the previous step's optimizer and is
** waited at 'at' (before the call). Empty without overlap.
]]
function M.comm_lanes(cfg, prog)
    local lanes = {}
    for _, sp in ipairs(prog.stages) do
        local list, ncalls = {}, {}
        for _, o in ipairs(sp.schedule) do
            if o.calls then
                ncalls[o.chunk] = ncalls[o.chunk] or {}
                ncalls[o.chunk][o.kind] = #o.calls
            end
        end
        for _, name in ipairs(cfg.overlap and { "reduce", "gather" } or {}) do
            for _, a in ipairs(sp.overlap[name]) do
                local phase, call = a.at:match("^(%a)(%d+)$")
                call = tonumber(call)
                local vp = sp.chunks[a.chunk + 1].vp
                local n = ncalls[vp][phase]
                list[#list + 1] = { kind = name, op = a, at = {
                    kind = phase, mb = name == "reduce" and cfg.nmb - 1 or 0, chunk = vp,
                    frac = name == "reduce" and call / n or (call - 1) / n, call = call } }
            end
        end
        lanes[sp.stage] = list
    end
    return lanes
end

-- The calls of the F or B op (micro-batch mb, chunk c) of stage sp.
local function op_calls(sp, kind, mb, c)
    for _, o in ipairs(sp.schedule) do
        if o.kind == kind and o.mb == mb and o.chunk == c then return o.calls end
    end
end

local function call_text(c)
    return c.global and string.format("%s (layer %d)", c.op, c.global) or c.op
end

-- Append the rank's program to 'out': its stage source and its unrolled schedule.
function M.pipeline_rank(cfg, topo, part, sched, prog, r, out)
    local pl = M.pipeline(cfg, sched, prog)
    local c = topology.coords(topo, r)
    local k = c.pp
    local st, rec = part.stages[k + 1], pl.stages[k]
    local prev, nxt = topology.neighbours(topo, r)
    out[#out + 1] = ""
    out[#out + 1] = string.format("program: stage%d.c (stage %d of %d: %s)", k, k, cfg.pp,
                                  require("program").stage_title(st))
    out[#out + 1] = "  run by     ranks " .. topology.stage_ranks_text(topo, k, 80)
    out[#out + 1] = "  schedule   " .. M.schedule_text(cfg, pl.kind)
    out[#out + 1] = string.format("             %d warm-up, %d steady, %d cool-down steps; " ..
                                  "%d micro-batches in flight at most", rec.warmup, rec.steady,
                                  rec.cooldown, rec.inflight)
    if cfg.pp > 1 then
        out[#out + 1] = string.format("  neighbours prev rank %d (stage %d), next rank %d " ..
                                      "(stage %d)", prev, (k - 1) % cfg.pp, nxt,
                                      (k + 1) % cfg.pp)
    end
    local ch_of = {}
    for _, ch in ipairs(st.chunks) do ch_of[ch.vp] = ch end
    local rows = { { "#", "phase", "step" } }
    local PHASE = { warmup = "warm-up", steady = "steady", cooldown = "cool-down" }
    for i, s in ipairs(pl.sched.stages[k + 1].steps) do
        local texts = step_text(cfg, k, ch_of, s, rec.slot_of, prev, nxt)
        rows[#rows + 1] = { tostring(i), PHASE[s.phase] or "-", texts[1] }
        for j = 2, #texts do rows[#rows + 1] = { "", "", "  and " .. texts[j] } end
    end
    for _, line in ipairs(util.columns(rows, "rll")) do out[#out + 1] = "  " .. line end
    if not prog then return end
    -- the communication lane: what is in flight while the schedule computes
    local lane = M.comm_lanes(cfg, prog)[k]
    if #lane > 0 then
        local step_of = {}
        for i, s in ipairs(pl.sched.stages[k + 1].steps) do
            if s.kind == "F" or s.kind == "B" then step_of[s.kind .. s.mb .. "." .. s.chunk] = i end
        end
        out[#out + 1] = "  communication in flight (overlapped with the computation; " ..
                        "docs/PROGRAM.md §4)"
        for _, c in ipairs(lane) do
            local a, at = c.op, c.at
            local coll = a.stmts[1].coll
            local calls = op_calls(prog.stages[k + 1], at.kind, at.mb, at.chunk)
            local where = string.format("step %d (%s mb %d, chunk %d)",
                step_of[at.kind .. at.mb .. "." .. at.chunk], at.kind == "F" and "forward" or
                "backward", at.mb, at.chunk)
            out[#out + 1] = string.format("    %s of %s (%s %s) over %s", OP_TEXT[coll.op],
                a.what, util.thousands(coll.n), coll.dtype, group_text(topo, coll.group, r))
            if c.kind == "reduce" then
                out[#out + 1] = string.format("      started in %s after %s, waited after " ..
                    "the schedule", where, call_text(calls[at.call]))
            else
                out[#out + 1] = string.format("      started after AdamW, waited in the next " ..
                    "%s before %s", where, call_text(calls[at.call]))
            end
        end
    end
    -- the collectives after the schedule, in the program's order (its step's tail)
    out[#out + 1] = "  then"
    for _, o in ipairs(prog.stages[k + 1].tail) do
        if o.kind == "DP_WAIT" then
            out[#out + 1] = "    wait for the data-parallel reductions in flight"
        end
        for _, c in ipairs(o.comm) do
            local where = c.group == "world" and "the world" or group_text(topo, c.group, r)
            out[#out + 1] = string.format("    %s %s over %s%s", OP_TEXT[c.op],
                                          TAIL_WHAT[o.kind], where, (o.kind == "PARAM_ALLGATHER"
                                          and cfg.overlap) and ", started" or "")
        end
    end
end

-- -- Distributed optimizer: the rank's shard, its three ranges, bytes saved -----------------------

-- The rank's pieces of the distributed optimizer's shards (docs/megatron.md §5.3-5.4):
-- the rank at position d of a buffer's reduce group (dp-cp; expt-dp for expert buffers) owns
-- elements [start + d*shard, start + (d+1)*shard) of every bucket. For each parameter piece in
-- them, the three ranges of docs/megatron.md §5.7, half-open, in elements:
--   world  offsets in the gradient buffer (the whole padded buffer, all buckets),
--   loc    offsets in this rank's shard of the buffer (the program's AdamW m and v: the bucket
--          shards one after another; the reduced gradients stay in place in the buffer),
--   param  offsets inside the parameter's local tensor (this TP rank's shard), flattened.
-- -> { group, shards, pos, buffers = { {index, chunk, kind, size, numel, shard, buckets = {
--    {index, start, size, shard, base, lo, hi, padding, pieces = { {name, numel, world = {a, b},
--    loc = {a, b}, param = {a, b}} }} }} } }; pure, for the report and the tests.
function M.optimizer_shard(cfg, topo, sh, r)
    local cls = shards.class_of(sh, r)
    local out = { buffers = {} }
    for bi, b in ipairs(cls.buffers) do
        local group = b.kind == "expert" and "expt-dp" or "dp-cp"
        local _, pos = topology.group_of(topo, group, r)
        if not out.group then out.group, out.shards, out.pos = group, b.dp_shards, pos end
        local buf = { index = bi - 1, chunk = b.chunk, kind = b.kind, group = group, pos = pos,
                      shards = b.dp_shards, size = b.size, numel = b.numel, shard = b.shard,
                      buckets = {} }
        local base = 0
        for ki, bk in ipairs(b.buckets) do
            local lo = bk.start + pos * bk.shard
            local hi = lo + bk.shard
            local rec = { index = ki - 1, start = bk.start, size = bk.size, shard = bk.shard,
                          base = base, lo = lo, hi = hi, pieces = {} }
            local held = 0
            for _, s in ipairs(bk.slots) do
                local a, z = math.max(lo, s.offset), math.min(hi, s.offset + s.numel)
                if a < z then
                    rec.pieces[#rec.pieces + 1] = {
                        name = s.name, numel = s.numel, world = { a, z },
                        loc = { base + a - lo, base + z - lo },
                        param = { a - s.offset, z - s.offset },
                    }
                    held = held + z - a
                end
            end
            rec.padding = bk.shard - held
            buf.buckets[#buf.buckets + 1] = rec
            base = base + bk.shard
        end
        out.buffers[#out.buffers + 1] = buf
    end
    return out
end

-- Bytes per parameter with the distributed optimizer (docs/megatron.md §5.7):
-- param + grad + optim/d.
local function per_param_text(d, dt)
    return string.format("%d + %d/d", dt.param + dt.grad, dt.optim)
end

-- Append the distributed-optimizer section of rank r's report to 'out' (only with DIST_OPT).
function M.distopt_rank(cfg, topo, sh, prog, r, out)
    if not cfg.dist_opt then return end
    local os_ = M.optimizer_shard(cfg, topo, sh, r)
    local cls = shards.class_of(sh, r)
    out[#out + 1] = ""
    out[#out + 1] = string.format("distributed optimizer: rank %d is %s rank %d of %d and owns " ..
                                  "shard %d of every bucket", r, os_.group, os_.pos, os_.shards,
                                  os_.pos)
    out[#out + 1] = "  (docs/megatron.md §5.7, [start, end) in elements: world = in the " ..
                    "gradient buffer, local = in this"
    out[#out + 1] = "   rank's shard (AdamW m and v), param = inside the " ..
                    "parameter's local tensor, flattened)"
    for _, b in ipairs(os_.buffers) do
        out[#out + 1] = string.format("  buffer %d (chunk %d, %s): %s elements (%s padding), " ..
                                      "%d bucket%s, shard %s", b.index, b.chunk, b.kind,
                                      util.thousands(b.size), util.thousands(b.size - b.numel),
                                      #b.buckets, #b.buckets == 1 and "" or "s",
                                      util.thousands(b.shard))
        for _, k in ipairs(b.buckets) do
            out[#out + 1] = string.format("    bucket %d [%d, %d), shard %s", k.index, k.start,
                                          k.start + k.size, util.thousands(k.shard))
            out[#out + 1] = string.format("      this rank: world [%d, %d), local [%d, %d), " ..
                                          "%s padding", k.lo, k.hi, k.base, k.base + k.shard,
                                          util.thousands(k.padding))
            -- one row per piece, and below a straddling one the other owners (the shards its
            -- ends fall in); pieces stack on two lines where the table would not fit
            local rows, notes = { { "parameter", "world", "local", "param", "of" } }, {}
            for _, pc in ipairs(k.pieces) do
                local others = {}
                local first = (pc.world[1] - pc.param[1] - k.start) // k.shard
                local last = (pc.world[2] - pc.param[2] + pc.numel - 1 - k.start) // k.shard
                for q = first, last do
                    if q ~= b.pos then others[#others + 1] = q end
                end
                rows[#rows + 1] = {
                    pc.name, string.format("[%d, %d)", pc.world[1], pc.world[2]),
                    string.format("[%d, %d)", pc.loc[1], pc.loc[2]),
                    string.format("[%d, %d)", pc.param[1], pc.param[2]), tostring(pc.numel),
                }
                notes[#rows] = #others > 0 and string.format("straddles: the rest on %s " ..
                    "rank%s %s", b.group, #others == 1 and "" or "s",
                    util.ranks(others, 1, #others, 40)) or nil
            end
            local lines = util.columns(rows, "lrrrr")
            local wide = false
            for _, line in ipairs(lines) do wide = wide or #line + 6 > 100 end
            if #k.pieces == 0 then
                out[#out + 1] = "      (padding only)"
            end
            for i, line in ipairs(#k.pieces > 0 and lines or {}) do
                if not wide then
                    out[#out + 1] = "      " .. line
                elseif i > 1 then
                    local row = rows[i]
                    out[#out + 1] = string.format("      %s (of %s)", row[1], row[5])
                    out[#out + 1] = string.format("          world %s  local %s  param %s",
                                                  row[2], row[3], row[4])
                end
                if notes[i] then out[#out + 1] = "          " .. notes[i] end
            end
        end
    end
    -- the byte table (docs/megatron.md §5.7) for this rank's parameters, then what this
    -- program allocates
    local d = os_.shards
    out[#out + 1] = string.format("  memory it saves (bytes per parameter: " ..
                                  "docs/megatron.md §5.7; d = %d; this rank's totals)", d)
    local rows = { { "", "B/param", "with dist-opt", "without", "with", "saved" } }
    for _, dt in ipairs(sh.dtypes) do
        local without = shards.bytes_of(cls, dt.name, false)
        local with = shards.bytes_of(cls, dt.name, true)
        rows[#rows + 1] = { dt.label, tostring(dt.param + dt.grad + dt.optim),
                            string.format("%s = %.2f", per_param_text(d, dt),
                                          dt.param + dt.grad + dt.optim / d),
                            util.bytes(without.total), util.bytes(with.total),
                            util.bytes(without.total - with.total) }
    end
    local size, shard = 0, 0
    for _, b in ipairs(cls.buffers) do size, shard = size + b.size, shard + b.shard end
    -- the program's parameters and f32 gradients (whole buffer; the gradient shard is
    -- reduced in place), f32 main parameters (bf16) and moments (the shard): its plan,
    -- program.lua; without the distributed optimizer the state would span the whole buffer
    local p, st = cfg.bf16 and 2 or 4, cfg.bf16 and 12 or 8
    local prog_with = prog and prog.stages[shards.class_of(sh, r).pp + 1].param_bytes
                      or (p + 4) * size + st * shard
    local prog_without = prog_with + st * (size - shard)
    rows[#rows + 1] = { string.format("this program (%s)", cfg.bf16 and "bf16" or "f32"),
                        tostring(p + 4 + st),
                        string.format("%d + %d/d = %.2f", p + 4, st, p + 4 + st / d),
                        util.bytes(prog_without), util.bytes(prog_with),
                        util.bytes(prog_without - prog_with) }
    for _, line in ipairs(util.columns(rows, "lrlrrr")) do out[#out + 1] = "    " .. line end
end

-- -- Mixture of experts: the rank's experts, their groups, the token traffic ----------

-- A count for the report: integers with thousands separators, other values with 1 decimal.
local function count_text(x)
    if x == math.floor(x) then return util.thousands(math.tointeger(x) or math.floor(x)) end
    return string.format("%.1f", x)
end

-- The token traffic of one MoE layer per micro-batch on one rank at a balanced load, summed
-- from the collectives the generated layer runs (layer.lua: its all-to-alls over ep and
-- expt-tp, each with the rows it moves per peer): the kept rows and their probabilities to
-- the experts' ranks, over expt-tp the gather of every member's rows and the reduce-scatter of
-- the partial outputs, the outputs back; backward the same, mirrored. A probabilities'
-- exchange is counted with the rows' before it (one op of width C + 1).
-- -> { tokens, choices, kept, capacity (nil without a factor), rows_ep (per EP peer),
--      rows_etp (a member's received rows), ops = { {pass, op, group, what, width, peers,
--      rows, bytes (per peer), off (to the other members), sent (all members, itself
--      included)} }, forward, backward (off-rank bytes), sent }; nil for a dense model. Pure.
local A2A_OP = { EP = "all-to-all", ETP_ROWS = "all-gather", ETP_PROBS = "all-gather",
                 ETP_SUM = "reduce-scatter", ETP_SUM_PROBS = "reduce-scatter" }
function M.moe_traffic(cfg)
    if not cfg.model.moe then return nil end
    local program = require("program")
    local layer = require("layer")
    local s = program.sizes(cfg)
    local t = layer.moe_load(cfg, s)
    t.ops, t.forward, t.backward, t.sent = {}, 0, 0, 0
    local lp = layer.build(cfg, s, {})
    local peers = { ep = cfg.ep, ["expt-tp"] = cfg.etp }
    for _, pc in ipairs({ { "forward", lp.layer_fwd }, { "backward", lp.layer_bwd } }) do
        local last
        for _, c in ipairs(pc[2].comm) do
            if c.op == "alltoallv" and c.rows then
                local es = c.dtype == "bf16" and 2 or 4
                if c.what then
                    last = { pass = pc[1], op = A2A_OP[c.a2a] or A2A_OP[c.a2a:match("^%u+")],
                             group = c.group, what = c.what, width = 0, peers = peers[c.group],
                             rows = c.rows, bytes = 0 }
                    t.ops[#t.ops + 1] = last
                end
                last.width = last.width + c.width
                last.bytes = last.bytes + c.rows * c.width * es
            end
        end
    end
    for _, o in ipairs(t.ops) do
        o.off, o.sent = (o.peers - 1) * o.bytes, o.peers * o.bytes
        t[o.pass] = t[o.pass] + o.off
        t.sent = t.sent + o.sent
    end
    return t
end

-- The global ids of the experts rank 'r' holds (contiguous: ep_rank*E/EP ...).
function M.moe_experts(cfg, topo, r)
    local nl = cfg.model.moe.experts // cfg.ep
    local first = topology.coords(topo, r).ep * nl
    return first, first + nl - 1
end

-- -- Context parallelism (docs/megatron.md §12) --------------------------------------------------

-- The attention's cp communication on one rank per attention layer and micro-batch, summed
-- from the hops and all-to-alls the generated layer runs (layer.lua): the p2p ring sends a K|V
-- block of N = MBS*SEQ/CP rows of 2*KV*D/TP channels (its kv heads' K|V, the activations'
-- dtype; GPT: 2*C/TP) to the next cp rank
-- CP-1 times forward; backward CP-1 times with its f32 dK|dV, then the dK|dV alone once (and,
-- with selective recompute of the attention core, the forward's hops again).
-- -> { rows, channels, kv (bytes of one K|V block), dkv (f32 dK|dV), forward, backward, hops
-- = { forward K|V, backward K|V, backward dK|dV } } in bytes sent by the rank; nil without CP.
-- CP_COMM=a2a: forward, the rank's q|k|v (N rows of (H + 2*KV)*D/TP channels) and then the
-- attention output (C/TP) go to the other CP-1 cp ranks a head group each (1/CP of the columns);
-- backward, the output gradient and then dq|dk|dv the same way: { rows, channels (q|k|v),
-- forward, backward } bytes sent off the rank, and a2a = true. Pure.
function M.cp_traffic(cfg)
    if cfg.cp == 1 then return nil end
    local program = require("program")
    local layer = require("layer")
    local CP, es = cfg.cp, cfg.bf16 and 2 or 4
    local s = program.sizes(cfg)
    local lp = layer.build(cfg, s, {})
    local t = { rows = s.N, a2a = cfg.cp_comm == "a2a" or nil, hops = { 0, 0, 0 } }
    for k, code in ipairs({ lp.layer_fwd, lp.layer_bwd }) do
        local sent = 0
        for _, c in ipairs(code.comm) do
            local ces = c.dtype == "bf16" and 2 or 4
            if c.op == "ring" then
                sent = sent + c.n * ces + (c.n2 or 0) * 4
                if c.n > 0 then t.hops[k] = t.hops[k] + 1 end
                if c.n2 then t.hops[3] = t.hops[3] + 1 end
            elseif c.op == "alltoall" and c.group == "cp" then
                sent = sent + (CP - 1) * c.n * ces
            end
        end
        t[k == 1 and "forward" or "backward"] = sent
    end
    if t.a2a then
        t.channels = s.qkv_local
    else
        t.channels = 2 * s.kv_c
        t.kv, t.dkv = s.N * t.channels * es, s.N * t.channels * 4
    end
    return t
end

-- Append rank r's context-parallel section to 'out' (CP > 1 only): its chunks, its ring
-- neighbours, the bytes each attention layer exchanges per micro-batch and per step.
function M.cp_rank(cfg, topo, part, prog, r, out)
    if cfg.cp == 1 then return end
    local c, CP = topology.coords(topo, r), cfg.cp
    local s = topology.axis_stride(topo.dense, "cp")
    local tc = cfg.seq // (2 * CP)
    local chunks = { c.cp, 2 * CP - 1 - c.cp }
    local t = M.cp_traffic(cfg)
    local function line(what, bytes)
        out[#out + 1] = string.format("    %-50s %12s sent", what, util.bytes(bytes))
    end
    out[#out + 1] = ""
    out[#out + 1] = string.format("context parallelism: CP %d, %s", CP, t.a2a and
                                  "all-to-all of heads and sequence (CP_COMM=a2a)" or
                                  "p2p ring (K|V blocks travel around the cp group)")
    if t.a2a then
        out[#out + 1] = string.format("  this rank     cp %d of %d; all-to-all over the cp group",
                                      c.cp, CP)
    else
        out[#out + 1] = string.format("  this rank     cp %d of %d; ring: from rank %d (cp %d), " ..
                                      "to rank %d (cp %d)", c.cp, CP,
                                      r + ((c.cp + CP - 1) % CP - c.cp) * s, (c.cp + CP - 1) % CP,
                                      r + ((c.cp + 1) % CP - c.cp) * s, (c.cp + 1) % CP)
    end
    out[#out + 1] = string.format("  tokens        chunks %d and %d of %d: positions %d-%d and " ..
                                  "%d-%d of each sequence of %d", chunks[1], chunks[2], 2 * CP,
                                  chunks[1] * tc, chunks[1] * tc + tc - 1, chunks[2] * tc,
                                  chunks[2] * tc + tc - 1, cfg.seq)
    if t.a2a then
        local hg = cfg.model.heads // cfg.tp // CP
        out[#out + 1] = string.format("  attention     %s of this tp rank's %d, over the whole " ..
                                      "sequence", hg == 1 and string.format("head %d", c.cp * hg)
                                      or string.format("heads %d-%d", c.cp * hg,
                                                       c.cp * hg + hg - 1), hg * CP)
        out[#out + 1] = "  per attention layer and micro-batch:"
        line("forward: q|k|v out, the output back", t.forward)
        line("backward: output gradient out, dq|dk|dv back", t.backward)
    else
        out[#out + 1] = string.format("  attention     per layer and micro-batch: a K|V block " ..
                                      "of %d rows x %d channels", t.rows, t.channels)
        out[#out + 1] = string.format("                (%s, %s), its dK|dV (f32, %s)",
                                      cfg.bf16 and "bf16" or "f32", util.bytes(t.kv),
                                      util.bytes(t.dkv))
        line(string.format("forward: %d hops of K|V", t.hops[1]), t.forward)
        line(string.format("backward: %d hops of K|V, %d of dK|dV", t.hops[2], t.hops[3]),
             t.backward)
    end
    local layers = 0
    for _, ch in ipairs(part.stages[c.pp + 1].chunks) do layers = layers + ch.count end
    out[#out + 1] = string.format("  per step      %d layers x %d micro-batches: %s sent and " ..
                                  "as much received", layers, cfg.nmb,
                                  util.bytes(layers * cfg.nmb * (t.forward + t.backward)))
    if not prog then return end     -- the topology alone (no program built)
    local bufs = {}
    for _, m in ipairs(prog.stages[c.pp + 1].mem) do
        if (m.id:match("^S_RING_") or m.id:match("^S_A2A_") or m.id:match("_SEQ$"))
           and m.how == "ALLOC" then
            bufs[#bufs + 1] = string.format("%s %s", m.id, util.bytes(m.bytes))
        end
    end
    local text = "  buffers       "
    for i, b in ipairs(bufs) do
        local piece = b .. (i < #bufs and "," or "")
        if #text + 1 + #piece > 100 then
            out[#out + 1] = text
            text = string.rep(" ", 16)
        end
        text = text .. (text:match("%S$") and " " or "") .. piece
    end
    out[#out + 1] = text
end

-- Append the mixture-of-experts section of rank r's report to 'out' (MoE models only).
function M.moe_rank(cfg, topo, part, sh, r, out)
    local moe = cfg.model.moe
    if not moe then return end
    local c = topology.coords(topo, r)
    local cls = shards.class_of(sh, r)
    local function group_text(name, width)
        local g = topology.group_of(topo, name, r)
        local kind = topology.kind(topo, name)
        return string.format("%s [%s]", name, util.ranks(topology.members(kind, g), 1,
                                                        kind.size, width or 24))
    end
    local function label(name) return "  " .. name .. string.rep(" ", 13 - #name) end
    local lo, hi = M.moe_experts(cfg, topo, r)
    local layers = {}
    for _, ch in ipairs(part.stages[c.pp + 1].chunks) do
        for i = ch.first, ch.first + ch.count - 1 do layers[#layers + 1] = i end
    end
    out[#out + 1] = ""
    out[#out + 1] = string.format("experts: %d per MoE layer, top %d, expert ffn %d%s%s",
                                  moe.experts, moe.top_k, moe.ffn_hidden,
                                  moe.pre_softmax and ", softmax before top-k" or "",
                                  moe.capacity_factor and
                                  string.format(", capacity factor %.9g", moe.capacity_factor)
                                  or "")
    out[#out + 1] = string.format("%sep %d of %d, expt-tp %d of %d, expt-dp %d of %d (expert " ..
                                  "grid etp-ep-edp-pp)", label("this rank"), c.ep, cfg.ep,
                                  c.etp, cfg.etp, c.edp, cfg.edp)
    -- the experts, their slices and their elements
    local enumel, slices = 0, {}
    for _, p in ipairs(cls.params) do
        if p.expert then
            enumel = enumel + p.numel
            if p.expert_id == lo and p.layer == layers[1] then
                local role = p.role:gsub("^mlp%.experts%.", "")
                local h = holds(p)
                slices[#slices + 1] = string.format("%s %s", role, h[1] == "all" and
                                                    ("whole " .. util.shape(p.shape)) or
                                                    (table.concat(h, " ") .. " of " ..
                                                     util.shape(p.shape)))
            end
        end
    end
    out[#out + 1] = string.format(label("holds") .. "%s (global ids) of each of its %d " ..
                                  "MoE layer%s (h.%s)", lo == hi and ("expert " .. lo) or
                                  string.format("experts %d-%d", lo, hi), #layers,
                                  #layers == 1 and "" or "s",
                                  util.ranks(layers, 1, #layers, 20))
    for i, s in ipairs(slices) do
        out[#out + 1] = (i == 1 and label("each") or label("")) .. s
    end
    out[#out + 1] = string.format(label("elements") .. "%s of this rank's %s (the model: %s in " ..
                                  "experts)", util.thousands(enumel), util.thousands(cls.numel),
                                  util.thousands(sh.unique_expert))
    -- where their gradients go
    local sample, router
    for _, p in ipairs(cls.params) do
        if p.expert and not sample then sample = p end
        if p.role == "mlp.router.weight" and not router then router = p end
    end
    local dpcp = cfg.dp * cfg.cp
    local function reduce_text(p)
        local parts = {}
        for _, g in ipairs(p.reduce) do
            local kind = topology.kind(topo, g)
            if topology.group_of(topo, g, r) and kind.size > 1 then
                parts[#parts + 1] = group_text(g)
            end
        end
        return #parts > 0 and table.concat(parts, " + ")
            or string.format("not reduced (%s has one member)", p.reduce[1])
    end
    out[#out + 1] = string.format("%s%s, scaled 1/(DP*CP) = 1/%d (%s buffer)",
                                  label("expert grads"), reduce_text(sample), dpcp, sample.buffer)
    if sample.buffer == "dense" then
        out[#out + 1] = label("") .. "(EP 1 and ETP = TP: the experts are split like the " ..
                        "dense MLP, in its buffer)"
    end
    local line = string.format("%sh.i.mlp.router.weight %s, replicated; grads: %s",
                               label("router"), util.shape(router.shape), reduce_text(router))
    if #line > 100 then      -- the groups on a line of their own
        out[#out + 1] = string.format("%sh.i.mlp.router.weight %s, replicated", label("router"),
                                      util.shape(router.shape))
        line = label("") .. "grads: " .. reduce_text(router)
    end
    out[#out + 1] = line
    if cfg.sp and cfg.tp > 1 then
        out[#out + 1] = label("") .. "(tp: under SP each tp rank routes its own sequence shard)"
    end
    local norm
    if cfg.dist_opt then
        norm = "in each rank's optimizer shard, summed over the world"
    elseif sample.buffer == "expert" then
        norm = (cfg.etp * cfg.ep * cfg.pp > 1) and ("summed over " .. group_text("tp-ep-pp"))
            or "this rank's experts (tp-ep-pp is this rank alone)"
    else
        norm = "with the dense parameters" .. (cfg.tp * cfg.pp > 1 and
                                              (", over " .. group_text("mp")) or "")
    end
    out[#out + 1] = label("grad norm") .. "experts " .. norm
    -- tokens and traffic
    local t = M.moe_traffic(cfg)
    out[#out + 1] = string.format(label("tokens") .. "per micro-batch: %d here (%s), %d choices",
                                  t.tokens, (cfg.sp and cfg.tp > 1) and "its sequence shard"
                                  or "the whole micro-batch", t.choices)
    out[#out + 1] = label("capacity") .. (t.capacity and string.format("an expert keeps <= %d " ..
                    "of this rank's %d choices, %s%s", t.capacity, t.choices,
                    moe.drop_policy == "probs" and "the highest probabilities first" or
                    "the earliest rows t*B+b first", moe.pad_to_capacity and
                    ", padded to the capacity" or "") or "none: no choice is dropped")
    local steps = #layers * cfg.nmb
    if #t.ops == 0 then
        out[#out + 1] = label("traffic") .. "none: EP 1 and ETP 1, the tokens stay on their rank"
        return
    end
    out[#out + 1] = string.format("  traffic per MoE layer and micro-batch, balanced load: %s " ..
                                  "of %s choices to each EP peer", count_text(t.rows_ep),
                                  count_text(t.kept))
    local names, seen = {}, {}
    for _, o in ipairs(t.ops) do
        if not seen[o.group] then
            seen[o.group] = true
            names[#names + 1] = group_text(o.group)
        end
    end
    out[#out + 1] = "    over " .. table.concat(names, " and ")
    local rows = { { "pass", "collective", "group", "what", "rows/peer", "B/peer",
                     "B off-rank" } }
    for _, o in ipairs(t.ops) do
        rows[#rows + 1] = { o.pass == "forward" and "fwd" or "bwd", o.op, o.group, o.what,
                            count_text(o.rows), count_text(o.bytes), count_text(o.off) }
    end
    for _, line in ipairs(util.columns(rows, "llllrrr")) do out[#out + 1] = "    " .. line end
    local function b(x) return util.bytes(math.floor(steps * x + 0.5)) end
    out[#out + 1] = string.format("%s%d layer%s x %d micro-batch%s: %s forward + %s backward " ..
                                  "off-rank", label("per step"), #layers,
                                  #layers == 1 and "" or "s", cfg.nmb, cfg.nmb == 1 and "" or "es",
                                  b(t.forward), b(t.backward))
    out[#out + 1] = string.format("%s= %s (%s with the blocks it sends itself), plus the row " ..
                                  "counts (ints)", label(""), b(t.forward + t.backward), b(t.sent))
end

return M
