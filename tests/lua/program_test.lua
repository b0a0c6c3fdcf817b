-- tests/lua/program_test.lua: program.build, the pass that decides the generated code
-- (gen/lua/program.lua). Checked against shards.lua's independent per-class records, against
-- hand-worked sizes, and against deliberately broken programs the verifier must refuse:
--   * the tensor tables (one layer's rows + each layer's bases, the other rows) place every
--     parameter of every rank class where shards.lua's buffer layout puts it;
--   * the pieces, expanded for each class's tp / expert-tp / ep coordinate as lib/stage.c
--     expands them, are exactly that class's pieces (vocabulary padding cut);
--   * the memory plan: a layer's bytes by hand for tiny, aliases without SP, MoE entries only
--     for MoE models, the total = parameters + every planned buffer;
--   * the communication of the library's calls and of the step's tail, per layout;
--   * the verifier consumes that list: a stage that drops or reorders a collective of a group
--     spanning stages is refused; the program and its JSON dump are deterministic;
--   * the evaluation's forward-only schedule: the step's forwards and activation messages, no
--     backward, verified (and refused with a message lost);
--   * the model's and the layout's texts (resume checkpoints): defaults filled in, the same
--     model under another file name alike, each field that differs seen.
-- Run: build/gen --lua tests/lua/program_test.lua (tests/lua/suite.sh).

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
require("strict")
local F = require("fixtures")
local T = require("harness")("program")
local json = require("json")
local program = require("program")
local schedule = require("schedule")

-- Layouts (model fields, sizes) covering TP/SP, PP/VP, uneven stages, DP with and without the
-- distributed optimizer, MoE folding, EP, ETP, vocabulary padding.
local LAYOUTS = {
    { {}, {} },
    { { layers = 8 }, { tp = 2, pp = 2, dp = 2 } },
    { { layers = 8 }, { tp = 2, pp = 2, dp = 2, sp = true, dist_opt = true, vp = 2, nmb = 4 } },
    { { layers = 6 }, { pp = 3, first_layers = 1, last_layers = 1, nmb = 3 } },
    { { vocab = 97, hidden = 35, heads = 5, seq_len = 30, layers = 2 },
      { tp = 5, sp = true, dp = 2, dist_opt = true } },
    { { add_bias_linear = false, moe = { experts = 8, top_k = 2 } },
      { tp = 2, dp = 2, ep = 2, sp = true } },
    { { layers = 8, add_bias_linear = false, moe = { experts = 8, top_k = 2 } },
      { tp = 2, pp = 2, dp = 2, ep = 2, etp = 1, vp = 2, nmb = 2, sp = true, dist_opt = true } },
    { { add_bias_linear = false, moe = { experts = 4, top_k = 1, pre_softmax = true } },
      { tp = 2, dp = 2, ep = 2, etp = 2, sp = true } },
}

local function each_layout(fn)
    for _, l in ipairs(LAYOUTS) do
        local cfg, topo, part, sh, sched, prog = F.build(l[1], l[2])
        fn(cfg, topo, part, sh, sched, prog)
    end
end

local function label(cfg)
    return string.format("%s tp%d pp%d dp%d ep%d etp%d vp%d%s%s", cfg.model.name, cfg.tp, cfg.pp,
                         cfg.dp, cfg.ep, cfg.etp, cfg.vp, cfg.sp and " sp" or "",
                         cfg.dist_opt and " distopt" or "")
end

-- Every buffer slot of a class, by tensor name: buffer (0-based) and offset.
local function slots_of(cls)
    local at = {}
    for bi, b in ipairs(cls.buffers) do
        for _, bk in ipairs(b.buckets) do
            for _, s in ipairs(bk.slots) do at[s.name] = { bi - 1, s.offset, s.numel } end
        end
    end
    return at
end

-- The tensors a stage's tables describe, as lib/stage.c expands them for one class: a list of
-- {layer (global or nil), role, expert (global or nil), buf, offset, n, param, table} in table
-- order, with the pieces for the class's coordinates.
local function expand(prog, cfg, sp, cls)
    local nl = cfg.model.moe and cfg.model.moe.experts // cfg.ep or 0
    local out, pieces = {}, {}
    local function add_pieces(list, first)
        for _, pc in ipairs(list) do
            local coord = pc.split == "TP" and cls.tp or pc.split == "ETP" and cls.etp or 0
            local grow = pc.grow + pc.step_row * coord
            local gcol = pc.gcol + pc.step_col * coord
            local rows = pc.rows
            if pc.vocab then rows = math.min(rows, cfg.model.vocab - grow) end
            if rows > 0 then
                pieces[#pieces + 1] = { param = first + pc.param, grow = grow, gcol = gcol,
                                        rows = rows, cols = pc.cols, lrow = pc.lrow,
                                        lcol = pc.lcol }
            end
        end
    end
    for ci, ch in ipairs(sp.chunks) do
        for j = 0, ch.layers - 1 do
            local first = #out
            for r, p in ipairs(sp.layer_params[ci]) do
                out[#out + 1] = {
                    layer = ch.first + j, role = prog.roles[p.role + 1].name,
                    expert = p.expert >= 0 and p.expert + cls.ep * nl or nil, buf = p.buf,
                    offset = ch.bases[j + 1][p.buf + 1] + p.offset +
                             (ch.shifts and ch.shifts[j + 1][r] or 0), n = p.n, field = p.field,
                }
            end
            add_pieces(sp.layer_pieces[ci], first)
        end
    end
    local first = #out
    for _, p in ipairs(sp.other_params) do
        out[#out + 1] = { role = prog.roles[p.role + 1].name, buf = p.buf, offset = p.offset,
                          n = p.n, field = p.field }
    end
    add_pieces(sp.other_pieces, first)
    return out, pieces
end

-- A tensor's name from its role pattern, layer and expert (as lib/tensors.c names it).
local function name_of(t)
    local n = t.role
    if t.layer then n = n:gsub("%%d", tostring(t.layer), 1) end
    if t.expert then n = n:gsub("%%d", tostring(t.expert), 1) end
    return n
end

T.test("the tensor tables place every parameter of every rank class", function()
    each_layout(function(cfg, _, _, sh, _, prog)
        for _, cls in ipairs(sh.classes) do
            local sp = prog.stages[cls.pp + 1]
            local at = slots_of(cls)
            local tensors = expand(prog, cfg, sp, cls)
            T.eq(#tensors, #cls.params, label(cfg) .. ": tensors of class " .. cls.id)
            T.eq(sp.nparams, #cls.params, label(cfg) .. ": nparams")
            local seen = {}
            for _, t in ipairs(tensors) do
                local name = t.field == "HEAD_WTE" and "wte.weight" or name_of(t)
                local want = at[name]
                T.ok(want, "%s: %s is in no buffer of class %d", label(cfg), name, cls.id)
                T.eq({ t.buf, t.offset, t.n }, want, label(cfg) .. ": place of " .. name)
                T.ok(not seen[name .. t.field], "%s: %s twice", label(cfg), name)
                seen[name .. t.field] = true
            end
        end
    end)
end)

T.test("the pieces, expanded per class, are the class's pieces (padding cut)", function()
    each_layout(function(cfg, _, _, sh, _, prog)
        for _, cls in ipairs(sh.classes) do
            local sp = prog.stages[cls.pp + 1]
            local tensors, pieces = expand(prog, cfg, sp, cls)
            local by_name = {}
            for _, p in ipairs(cls.params) do
                by_name[(p.tied and "tied:" or "") .. p.name] = p
            end
            local got, want = {}, {}
            for _, pc in ipairs(pieces) do
                local t = tensors[pc.param + 1]
                local key = t.field == "HEAD_WTE" and "tied:wte.weight" or name_of(t)
                got[#got + 1] = string.format("%s %d,%d %dx%d @%d,%d", key, pc.grow, pc.gcol,
                                              pc.rows, pc.cols, pc.lrow, pc.lcol)
            end
            for _, t in ipairs(tensors) do
                local key = t.field == "HEAD_WTE" and "tied:wte.weight" or name_of(t)
                local p = by_name[key]
                for _, pc in ipairs(p.pieces) do
                    local two = #p.shape == 2
                    want[#want + 1] = string.format("%s %d,%d %dx%d @%d,%d", key,
                        two and pc.start[1] or 0, pc.start[#pc.start], two and pc.size[1] or 1,
                        pc.size[#pc.size], two and pc.at[1] or 0, pc.at[#pc.at])
                end
            end
            table.sort(got)
            table.sort(want)
            T.eq(got, want, label(cfg) .. ": pieces of class " .. cls.id)
        end
    end)
end)

-- The plan entry 'id' of a stage.
local function mem(sp, id)
    for _, m in ipairs(sp.mem) do
        if m.id == id then return m end
    end
    error("no plan entry " .. id)
end

T.test("the memory plan: a layer by hand, aliases, MoE entries, the total", function()
    -- tiny, T=64, B=1, C=64, 4 heads, FF 256, TP 1: floats per layer and slot
    local _, _, _, _, _, prog = F.build({ layers = 2 }, {})
    local sp = prog.stages[1]
    local layer = 0
    for _, m in ipairs(sp.mem) do
        if m.id:match("^L_") and m.how == "ALLOC" then layer = layer + m.elems end
    end
    -- ln_1, attention output, x + attention, ln_2, output; 2 means, 2 rstds, q|k|v, the
    -- log-sum-exp (4 heads x 64 positions), c_fc and GELU outputs: no (T, T) matrix
    T.eq(layer, 5 * 4096 + 4 * 64 + 12288 + 4 * 64 + 2 * 64 * 256, "one layer")
    T.eq(mem(sp, "L_QKV").instance, 4 * 12288, "f32: 4 bytes an element")
    T.eq(mem(sp, "S_GATHER").how, "NONE", "without SP the gathered rows are the rows")
    T.eq(mem(sp, "ML_SCORES").how, "NONE", "no MoE buffers in a dense model")
    T.eq(mem(sp, "S_LOGITS").elems, 64 * 256, "logits (N, V_LOCAL) on the head stage")
    local total = sp.param_bytes
    for _, m in ipairs(sp.mem) do total = total + m.bytes end
    T.eq(sp.mem_bytes, total, "total = parameters + every planned buffer")
    T.eq(sp.param_bytes, 16 * prog.stages[1].buffers[1].size, "f32 p, g, m, v")

    local _, _, _, _, _, p2 = F.build({ layers = 4 }, { tp = 2, sp = true, pp = 2, nmb = 2 })
    T.eq(mem(p2.stages[1], "S_GATHER").elems, 64 * 64, "under SP one gathered input, shared")
    T.eq(mem(p2.stages[1], "L_LN1").elems, 32 * 64, "under SP a layer keeps its own rows only")
    T.eq(mem(p2.stages[1], "S_LOGITS").how, "NONE", "no logits before the last stage")
    T.eq(mem(p2.stages[1], "C_TOKENS").count, p2.stages[1].chunks[1].slots, "token ids per slot")
    T.eq(mem(p2.stages[2], "C_TOKENS").how, "NONE", "no token ids after the first stage")

    local _, _, _, _, _, p3 = F.build({ moe = { experts = 4, top_k = 2 } }, { dp = 2, ep = 2 })
    local s3 = p3.stages[1]
    T.eq(mem(s3, "ML_XE").elems, 64 * 2 * 2 * 64, "expert inputs: N_SP*K*EP rows of C")
    T.eq(mem(s3, "L_FC").how, "NONE", "no dense MLP activations in a MoE model")
    T.eq(mem(s3, "X_STAT").elems, s3.nparams + 3, "norm pieces + 3")
end)

T.test("the memory plan in bf16: 2-byte activations and parameters, f32 the rest", function()
    local _, _, _, _, _, f32 = F.build({ layers = 2 }, { dp = 2 })
    local _, _, _, _, _, b16 = F.build({ layers = 2 }, { dp = 2, bf16 = true })
    local s32, s16 = f32.stages[1], b16.stages[1]
    for _, id in ipairs({ "L_LN1", "L_QKV", "L_ATTY", "L_RES2", "C_X", "S_LOGITS" }) do
        T.eq(mem(s16, id).instance * 2, mem(s32, id).instance, id .. ": half the bytes")
    end
    for _, id in ipairs({ "L_LN1_MEAN", "L_LSE", "S_CE", "X_STAT", "C_TOKENS" }) do
        T.eq(mem(s16, id).instance, mem(s32, id).instance, id .. ": f32 or i32 either way")
    end
    local n = s16.buffers[1].size
    T.eq({ s16.params.params, s16.params.main, s16.params.grads, s16.params.moments },
         { 2 * n, 4 * n, 4 * n, 8 * n }, "bf16 parameters, f32 main copy, gradients, moments")
    T.eq(s16.param_bytes, 18 * n, "18 bytes per parameter (docs/megatron.md §5.7)")
    T.eq(s32.param_bytes, 16 * n, "16 in f32: no main copy")
    local _, _, _, _, _, dist = F.build({ layers = 2 }, { dp = 2, bf16 = true, dist_opt = true })
    local sd = dist.stages[1]
    local shard = sd.buffers[1].state
    T.eq(shard * 2, sd.buffers[1].size, "the shard is half the buffer on DP 2")
    T.eq(sd.param_bytes, 6 * sd.buffers[1].size + 12 * shard, "6 + 12/d bytes per parameter")
end)

T.test("recompute: what each layer keeps, the workspace, the recompute calls", function()
    local function build(opts)
        opts.pp, opts.nmb = 2, 4
        local _, _, _, _, _, prog = F.build({ layers = 8 }, opts)
        return prog.stages[1]
    end
    local none = build({})
    local full = build({ recompute = "full", recompute_method = "uniform", recompute_layers = 3 })
    local works, keeps = {}, {}
    for j, l in ipairs(full.chunks[1].store) do works[j], keeps[j] = l.work, l.keep_out end
    T.eq(works, { 0, 1, 2, 0 }, "uniform 3 over 4 layers: groups 0-2 and 3")
    T.eq(keeps, { false, false, true, true }, "each group's output stays in the slot")
    T.eq({ mem(full, "L_QKV").count, mem(full, "L_QKV").work }, { 0, 3 },
         "full: no layer buffer in a slot, one per workspace position")
    local slots = none.chunks[1].slots
    T.eq({ mem(full, "L_RES2").count, mem(full, "L_RES2").work }, { 2 * slots, 2 },
         "the groups' outputs per slot; the others' in the workspace")
    local calls = {}
    for _, o in ipairs(full.schedule) do
        if o.kind == "B" then
            for _, c in ipairs(o.calls) do
                calls[#calls + 1] = c.op:gsub("^layer_", "") .. (c.layer or "")
            end
            break
        end
    end
    T.eq(calls, { "recompute3", "bwd3", "recompute0", "recompute1", "recompute2", "bwd2",
                  "bwd1", "bwd0", "embedding_bwd" }, "each group's forward again, then its backward")
    local block = build({ recompute = "full", recompute_method = "block", recompute_layers = 2 })
    works = {}
    for j, l in ipairs(block.chunks[1].store) do works[j] = l.work end
    T.eq(works, { 0, 0, -1, -1 }, "block 2: the first two layers, one by one")
    T.ok(block.mem_bytes < none.mem_bytes and full.mem_bytes < block.mem_bytes,
         "full uniform < block < none (%d, %d, %d)", full.mem_bytes, block.mem_bytes,
         none.mem_bytes)
    local sel = build({ recompute = "selective", recompute_modules = "core_attn,mlp" })
    for _, id in ipairs({ "L_ATTY", "L_LSE", "L_FC", "L_GELU" }) do
        T.eq({ mem(sel, id).count, mem(sel, id).work }, { 0, 1 }, id .. ": one, in the workspace")
    end
    T.eq(mem(sel, "L_QKV").count, 4 * slots, "q|k|v kept in every slot")
    local ops = {}
    for _, o in ipairs(sel.schedule) do
        if o.kind == "B" then
            for _, c in ipairs(o.calls) do ops[c.op] = true end
        end
    end
    T.ok(not ops.layer_recompute, "selective: the layers recompute inside their backward")
end)

-- The collectives of a stage's ops, as "op group n" strings.
local function comm_text(ops)
    local out = {}
    for _, o in ipairs(ops) do
        for _, c in ipairs(o.comm) do
            out[#out + 1] = c.op .. " " .. c.group .. (c.n and (" " .. c.n) or "")
        end
    end
    return out
end

local function first_op(sp, kind)
    for _, o in ipairs(sp.schedule) do
        if o.kind == kind then return o end
    end
end

T.test("communication: the layers' regions by TP and SP, the step's tail by layout", function()
    local nc, nspc = 64 * 64, 32 * 64
    local function layer_comm(opts)
        local _, _, _, _, _, prog = F.build({ layers = 2 }, opts)
        for _, c in ipairs(first_op(prog.stages[1], "F").calls) do
            if c.op == "layer_fwd" then return comm_text({ c }) end
        end
    end
    T.eq(layer_comm({}), {}, "TP 1: no collective in a layer")
    T.eq(layer_comm({ tp = 2 }), { "allreduce tp " .. nc, "allreduce tp " .. nc },
         "TP 2: the row-parallel outputs all-reduced")
    T.eq(layer_comm({ tp = 2, sp = true }),
         { "allgather tp " .. nspc, "reduce_scatter tp " .. nspc, "allgather tp " .. nspc,
           "reduce_scatter tp " .. nspc }, "TP 2 + SP: gathered in, reduce-scattered out")

    -- without overlap the tail reduces over dp first, as Megatron's finalize_model_grads: the
    -- layers' bucket, then the shared embedding's own
    local _, _, _, _, _, prog = F.build({ layers = 8 }, { tp = 2, pp = 2, dp = 2,
                                                          no_overlap = true })
    T.eq(comm_text(prog.stages[1].tail), { "allreduce dp-cp 104960", "allreduce dp-cp 8192",
         "allreduce embd 8192", "allreduce mp 1", "allreduce world 2" },
         "stage 0: dp, wte, norm over mp, loss and stop")
    -- with it, the last micro-batch's last backward starts the dp reduction; the tail waits
    _, _, _, _, _, prog = F.build({ layers = 8 }, { tp = 2, pp = 2, dp = 2 })
    T.eq(comm_text(prog.stages[1].tail), { "allreduce embd 8192", "allreduce mp 1",
         "allreduce world 2" }, "overlap: stage 0's tail without the dp reduction")
    local last_b
    for _, o in ipairs(prog.stages[1].schedule) do if o.kind == "B" then last_b = o end end
    local b_comm = comm_text({ last_b })
    T.eq({ table.unpack(b_comm, #b_comm - 1) }, { "allreduce dp-cp 104960", "allreduce dp-cp 8192" },
         "overlap: the last backward starts the dp reductions, after the layers' own")
    _, _, _, _, _, prog = F.build({ layers = 4 }, { dp = 2, dist_opt = true, sp = true, tp = 2,
                                                    no_overlap = true })
    local tail = comm_text(prog.stages[1].tail)
    -- per layer ln_1, ln_2 (weight, bias), both row-parallel biases; then ln_f: (4*6 + 2) * 64
    T.ok(tail[1]:match("^reduce_scatter dp%-cp"), "no overlap: the dp reduction first")
    local sp_at
    for i, t in ipairs(tail) do if t:match("^allreduce tp ") then sp_at = sp_at or i end end
    T.eq(tail[sp_at], "allreduce tp " .. (4 * 6 + 2) * 64, "SP: the sequence-parallel gradients")
    T.ok(not tail[sp_at - 1]:match("tp") and tail[sp_at - 1]:match("^reduce_scatter"),
         "SP: after the dp reductions")
    local rs, ag = 0, 0
    for _, t in ipairs(tail) do
        if t:match("^reduce_scatter dp%-cp") then rs = rs + 1 end
        if t:match("^allgather dp%-cp") then ag = ag + 1 end
    end
    T.ok(rs > 0 and rs == ag, "distributed optimizer: a reduce-scatter and an all-gather per " ..
         "bucket (%d, %d)", rs, ag)
    local world, mp = 0, 0
    for _, t in ipairs(tail) do
        if t == "allreduce world 1" or t == "allreduce world 2" then world = world + 1 end
        if t:match(" mp ") then mp = mp + 1 end
    end
    T.eq({ world, mp }, { 2, 0 }, "distributed optimizer: the norm over the world, not mp")
    _, _, _, _, _, prog = F.build({ moe = { experts = 4, top_k = 2 } }, { dp = 2, ep = 2 })
    tail = comm_text(prog.stages[1].tail)
    T.eq({ tail[#tail - 1], tail[#tail] }, { "allreduce world 1", "allreduce world 2" },
         "MoE: the aux loss, then the loss and the stop requests")
    local moe_fwd
    for _, c in ipairs(first_op(prog.stages[1], "F").calls) do
        if c.op == "layer_fwd" then moe_fwd = comm_text({ c }) end
    end
    T.eq(moe_fwd, { "alltoallv ep 4", "alltoallv ep", "alltoallv ep", "alltoallv ep" },
         "EP 2: counts (EP x EXPERTS_LOCAL), rows, probabilities out; outputs back")
end)

-- A program whose stage k's tail lost (or had swapped) a collective of a group that spans
-- the stages must be refused with a counterexample.
local function tamper(opts, k, fn)
    local cfg, topo, _, _, _, prog = F.build({ layers = 4 }, opts)
    fn(prog.stages[k + 1].tail)
    return function() program.check(prog, cfg, topo) end
end

-- The evaluation's forward-only schedule (program.forward_only): the training schedule's
-- forwards in order on their slots, its activation messages in order, no backward and no
-- gradient message; an exchange travels during a computation only where the training step's
-- does during that same forward; the verifier proves it (every layout builds) and refuses it
-- with an activation message lost.
T.test("the forward-only schedule: the step's forwards and activations; verified", function()
    local verify = require("verify")
    each_layout(function(cfg, topo, _, _, _, prog)
        for _, sp in ipairs(prog.stages) do
            local fw, acts, efw, eacts, at = {}, {}, {}, {}, {}
            for i, o in ipairs(sp.schedule) do
                if o.kind == "F" then
                    fw[#fw + 1] = { o.mb, o.chunk, o.slot, o.dy }
                    at[o.mb .. "." .. o.chunk] = i
                end
                for _, m in ipairs(o.kind == "X" and o.p2p or {}) do
                    if m.what == "act" then acts[#acts + 1] = { m.send, m.mb, m.chunk, m.slot } end
                end
            end
            for i, o in ipairs(sp.eval_schedule) do
                T.ok(o.kind == "F" or o.kind == "X", "%s: an op %s in the evaluation",
                     label(cfg), o.kind)
                if o.kind == "F" then efw[#efw + 1] = { o.mb, o.chunk, o.slot, o.dy } end
                for _, m in ipairs(o.kind == "X" and o.p2p or {}) do
                    T.eq(m.what, "act", label(cfg) .. ": only activations travel")
                    eacts[#eacts + 1] = { m.send, m.mb, m.chunk, m.slot }
                end
                if o.kind == "X" then
                    T.ok(#o.p2p > 0, "%s: an empty exchange", label(cfg))
                    -- async: the training step sends during the same forward
                    local nxt = sp.eval_schedule[i + 1]
                    local before = nxt and nxt.kind == "F" and
                                   sp.schedule[at[nxt.mb .. "." .. nxt.chunk] - 1]
                    T.ok(not o.async or (before and before.kind == "X" and before.async),
                         "%s: an exchange travels during a forward the step's does not",
                         label(cfg))
                end
            end
            T.eq(efw, fw, label(cfg) .. ": the forwards")
            T.eq(eacts, acts, label(cfg) .. ": the activation messages")
            local last = sp.eval_tail[#sp.eval_tail - 1]
            T.eq(last.kind, "LOSS_ALLREDUCE", label(cfg) .. ": the loss reduced")
        end
        if cfg.pp > 1 then          -- a stage that loses a receive: refused
            local ev = program.events(prog, cfg, true)
            local steps = ev.stages[2].steps
            for i, st in ipairs(steps) do
                if st.kind == "X" then table.remove(steps, i); break end
            end
            local ok, why = verify.check(ev, { forward_only = true })
            T.ok(not ok and why, "%s: an evaluation that lost a message is refused", label(cfg))
        end
        local _ = topo
    end)
end)

-- The bounds check (layer.check_bounds): every call of a layout's code stays inside the
-- buffers its stage's plan allocates; with one buffer an element short, the generator's own
-- check names the call, the buffer and the numbers (a short plan would be an overrun).
T.test("the code's calls stay inside the memory plan; a plan one element short is refused",
       function()
    local layer = require("layer")
    for _, l in ipairs(LAYOUTS) do
        local _, _, _, _, _, prog = F.build(l[1], l[2])
        for _, sp in ipairs(prog.stages) do
            local elems = {}
            for _, m in ipairs(sp.mem) do if m.how == "ALLOC" then elems[m.id] = m.elems end end
            for _, m in ipairs(sp.mem) do
                if m.how == "ALIAS" then elems[m.id] = elems[m.alias] end
            end
            local code = sp.chunks[1].layers > 0 and prog.layer.layer_bwd or prog.layer.head
            T.eq(layer.check_bounds(code.stmts, elems, "x"), nil, "fits: stage " .. sp.stage)
        end
    end
    local _, _, _, _, _, prog = F.build({ layers = 2 }, { tp = 2, sp = true })
    local elems = {}
    for _, m in ipairs(prog.stages[1].mem) do
        if m.how == "ALLOC" then elems[m.id] = m.elems end
    end
    for _, id in ipairs({ "L_QKV", "S_GATHER", "L_LN1_RSTD", "S_DFC" }) do
        local short = {}
        for k, v in pairs(elems) do short[k] = v end
        short[id] = short[id] - 1
        local why = layer.check_bounds(prog.layer.layer_bwd.stmts, short, "stage 0") or
                    layer.check_bounds(prog.layer.layer_fwd.stmts, short, "stage 0")
        T.ok(why and why:find(id, 1, true) and why:find("the plan allocates", 1, true),
             "%s one element short is refused: %s", id, tostring(why))
    end
end)

T.test("the verifier reads the program's communication: a dropped collective hangs", function()
    local check = tamper({ tp = 2, pp = 2, nmb = 2 }, 1, function(tail)
        for i, o in ipairs(tail) do
            if o.kind == "NORM_ALLREDUCE" then table.remove(tail, i); return end
        end
        error("no norm all-reduce")
    end)
    local lines = T.raises("failed verification", check)
    T.ok(table.concat(lines, "\n"):find("all-reduce on mp", 1, true) or
         table.concat(lines, "\n"):find("allreduce on", 1, true), "counterexample names the " ..
         "collective: %s", table.concat(lines, " | "))
end)

T.test("the verifier reads the program's communication: two collectives swapped", function()
    local check = tamper({ tp = 2, pp = 2, nmb = 2 }, 0, function(tail)
        local a, b
        for i, o in ipairs(tail) do
            if o.kind == "NORM_ALLREDUCE" then a = i end
            if o.kind == "LOSS_ALLREDUCE" then b = i end
        end
        tail[a], tail[b] = tail[b], tail[a]
    end)
    T.raises("failed verification", check)
end)

-- The overlapped communication (overlap.lua, verify.check_async): every layout of LAYOUTS,
-- with small gradient buckets (several per buffer) passes; a start moved before the call that
-- last writes its gradients, a parameter wait moved after the first read, and a dropped wait
-- are each refused, the counterexample naming the request and the call.
T.test("overlap: the requests in flight touch nothing; three misplacements are refused",
       function()
    local verify = require("verify")
    local overlap = require("overlap")
    for _, l in ipairs(LAYOUTS) do
        for _, bucket in ipairs({ false, 3000 }) do
            local o = {}
            for k, v in pairs(l[2]) do o[k] = v end
            o.bucket_size = bucket or nil
            local cfg, _, _, _, _, prog = F.build(l[1], o)
            for _, sp in ipairs(prog.stages) do
                T.eq(verify.check_async(overlap.events(sp, cfg), "stage"), true,
                     "stage %d of %s", sp.stage, json.encode(o))
            end
        end
    end
    local opts = { layers = 4 }
    local function built()
        local cfg, _, _, _, _, prog = F.build(opts, { dp = 2, dist_opt = true, bucket_size = 3000,
                                                      nmb = 2 })
        return cfg, prog.stages[1]
    end
    local function refused(cfg, sp, want)
        local ok, why = verify.check_async(overlap.events(sp, cfg), "stage 0")
        T.eq(ok, nil, "refused: " .. want)
        local text = table.concat(why or {}, " ")
        T.ok(text:find(want, 1, true), "the counterexample says %q: %s", want, text)
    end
    -- a start one call early: the call after it writes the bucket's gradients
    local cfg, sp = built()
    local items = sp.overlap.items[1].B
    for i = 2, #items do
        if items[i].kind == "start" and items[i - 1].kind == "call" then
            items[i], items[i - 1] = items[i - 1], items[i]
            break
        end
    end
    refused(cfg, sp, "writes gradients")
    -- a parameter wait one call late: the call before it reads them
    cfg, sp = built()
    items = sp.overlap.items[1].F
    for i = 1, #items - 1 do
        if items[i].kind == "wait" and items[i + 1].kind == "call" then
            items[i], items[i + 1] = items[i + 1], items[i]
            break
        end
    end
    refused(cfg, sp, "reads parameters")
    -- a reduction never waited: the norm reads its gradients in flight
    cfg, sp = built()
    for i, t in ipairs(sp.tail) do
        if t.kind == "DP_WAIT" then table.remove(sp.tail, i); break end
    end
    refused(cfg, sp, "is in flight when step 1, the tail's NORM_LOCAL reads every gradient")
end)

-- Pipeline messages overlapped: only exchanges that send activations, followed by a forward
-- or backward, go on during it (async); the verifier models them as still in flight: an
-- exchange that receives, marked async, is refused (the computation after it would read what
-- it receives before the wait).
T.test("overlap: a row's activations sent during its computation, modelled as in flight",
       function()
    local cfg, topo, _, _, _, prog = F.build({ layers = 8 }, { pp = 4, dp = 2, nmb = 8 })
    local n = 0
    for _, sp in ipairs(prog.stages) do
        for i, o in ipairs(sp.schedule) do
            if o.async then
                n = n + 1
                for _, m in ipairs(o.p2p) do
                    T.ok(m.send and m.what == "act", "async rows only send activations")
                end
                local nxt = sp.schedule[i + 1]
                T.ok(nxt and (nxt.kind == "F" or nxt.kind == "B"), "a computation follows")
            end
        end
    end
    T.ok(n > 0, "some rows overlap their messages")
    local _, _, _, _, _, off = F.build({ layers = 8 }, { pp = 4, dp = 2, nmb = 8,
                                                         no_overlap = true })
    for _, sp in ipairs(off.stages) do
        for _, o in ipairs(sp.schedule) do T.ok(not o.async, "no overlap: none") end
    end
    program.check(prog, cfg, topo)
    for _, o in ipairs(prog.stages[2].schedule) do
        if o.kind == "X" and not o.async then
            local recv = false
            for _, m in ipairs(o.p2p) do recv = recv or not m.send end
            if recv then o.async = true; break end
        end
    end
    local lines = T.raises("failed verification", function() program.check(prog, cfg, topo) end)
    T.ok(table.concat(lines, "\n"):find("does not wait for before computing", 1, true),
         "the counterexample says why: %s", table.concat(lines, " | "))
end)

T.test("deterministic: two builds give the same program and the same JSON", function()
    local function dump()
        local _, _, _, _, _, prog = F.build({ layers = 8, add_bias_linear = false,
                                              moe = { experts = 8, top_k = 2 } },
                                            { tp = 2, pp = 2, dp = 2, ep = 2, sp = true,
                                              vp = 2, nmb = 2, dist_opt = true })
        return json.encode(prog)
    end
    local a = dump()
    T.eq(dump(), a, "JSON of the program")
    T.ok(#a > 1000 and a:find('"schedule_kind"', 1, true), "the dump holds the program")
end)

T.test("the schedule is the one given: slots and counts agree with schedule.lua", function()
    each_layout(function(cfg, _, _, _, sched, prog)
        for r = 0, cfg.pp - 1 do
            local st, sp = sched.stages[r + 1], prog.stages[r + 1]
            T.eq({ sp.warmup, sp.steady, sp.cooldown }, { st.warmup, st.steady, st.cooldown },
                 label(cfg) .. ": phases of stage " .. r)
            local slots = schedule.assign_slots(st, cfg.vp)
            T.eq(sp.inflight, slots.inflight, label(cfg) .. ": in flight")
            local n = 0
            for _, o in ipairs(sp.schedule) do
                if o.kind == "F" or o.kind == "B" then n = n + 1 end
            end
            T.eq(n, 2 * cfg.nmb * cfg.vp, label(cfg) .. ": F and B of every micro-batch")
        end
    end)
end)

-- One gradient buffer's bytes (the C_DY entry's instance).
local function grad_bytes(sp)
    for _, m in ipairs(sp.mem) do
        if m.id == "C_DY" then return m.instance end
    end
end

-- The activation bytes of a stage's plan: its Mem entries of that category.
local function activation_bytes(sp)
    local n = 0
    for _, m in ipairs(sp.mem) do
        if m.category == "activations" then n = n + m.bytes - m.work_bytes end
    end
    return n
end

T.test("interleaved stages share one pool of activation slots, as many as in flight", function()
    local pooled = 0
    each_layout(function(cfg, _, _, _, sched, prog)
        for r = 0, cfg.pp - 1 do
            local sp = prog.stages[r + 1]
            local own = schedule.assign_slots(sched.stages[r + 1], cfg.vp)
            local sum, most = 0, 0        -- the chunks' own slots; the largest chunk's slot
            -- gradient buffers: far fewer than micro-batches in flight (1F1B: one; interleaved:
            -- two), each held from its arrival to the send of its input's
            T.ok(sp.grad_buffers >= 1 and sp.grad_buffers <= (cfg.vp > 1 and 2 or 1),
                 "%s stage %d: %d gradient buffers", label(cfg), r, sp.grad_buffers)
            for _, c in ipairs(sp.chunks) do
                sum = sum + own.nslots[c.vp] * c.slot_bytes
                most = math.max(most, c.slot_bytes)
            end
            if cfg.vp == 1 then
                T.eq(sp.pool_slots, 0, label(cfg) .. ": no pool without interleaving")
            elseif sp.pool_slots == 0 then
                -- kept only where a pool would not take less (a pool slot holds the largest
                -- chunk's at least)
                T.ok(sum <= sp.inflight * most, "%s stage %d: no pool, yet the chunks' own " ..
                     "slots (%d bytes) exceed %d in flight x %d", label(cfg), r, sum,
                     sp.inflight, most)
            else
                pooled = pooled + 1
                T.eq(sp.pool_slots, sp.inflight, label(cfg) .. ": pool of stage " .. r)
                for _, c in ipairs(sp.chunks) do
                    T.eq(c.slots, sp.pool_slots, label(cfg) .. ": a chunk's slots are the pool's")
                    T.ok(c.slot_bytes <= sp.pool_slot_bytes, "%s: a chunk's slot (%d bytes) " ..
                         "fits the pool's (%d)", label(cfg), c.slot_bytes, sp.pool_slot_bytes)
                end
                T.eq(activation_bytes(sp), sp.pool_slots * sp.pool_slot_bytes +
                     sp.grad_buffers * grad_bytes(sp),
                     label(cfg) .. ": activations = pool x slot bytes + gradient buffers")
                -- the chunks' own slots would hold the sum of their peaks: more
                T.ok(activation_bytes(sp) < sum, "%s stage %d: the pool (%d bytes) takes less " ..
                     "than each chunk's own slots (%d)", label(cfg), r, activation_bytes(sp), sum)
            end
        end
    end)
    T.ok(pooled >= 2, "stages with a pool checked: %d", pooled)
end)

-- Megatron-LM's count of a step's FLOPs (its throughput report), written out independently:
-- 12 x tokens x l h^2 x ((1 + g/n + s/h) (q projection / h) + (F/h) k gated + shared/h gated
-- + V/(2 l h)), gated = 3/2 with SwiGLU; for GPT the known 72 x tokens x l h^2 (1 + s/(6h) +
-- V/(12 l h)).
T.test("model FLOPs of a step: Megatron's count", function()
    local config = require("config")
    local cases = {
        { "gpt3_175b", { tp = 8, pp = 8, dp = 16, nmb = 64, mbs = 1 } },
        { "gpt2_124m", { mbs = 4, nmb = 2 } },
        { "llama3_70b", { tp = 8, pp = 4, vp = 2, nmb = 16 } },
        { "mixtral_8x7b", { tp = 2, pp = 4, dp = 8, ep = 8, nmb = 16, sp = true } },
    }
    for _, c in ipairs(cases) do
        local cfg = config.configure(config.load_model(c[1]), c[2])
        local m, s = cfg.model, program.sizes(cfg)
        local l, h, seq, V = m.layers, m.hidden, cfg.seq, cfg.vocab_padded
        local tokens = cfg.mbs * cfg.nmb * cfg.dp * seq
        local want
        if m.arch == "llama" then
            local n, g = m.heads, m.kv_heads
            local q = n * (h // n) / h
            local F, k, shared = m.ffn_hidden, 1, 0
            if m.moe then
                F, k, shared = m.moe.ffn_hidden, m.moe.top_k, m.moe.shared_expert_ffn or 0
            end
            want = 12 * tokens * l * h * h * ((1 + g / n + seq / h) * q + F / h * k * 1.5 +
                                              shared / h * 1.5 + V / (2 * l * h))
        else
            T.eq(m.ffn_hidden, 4 * h, c[1] .. ": GPT's MLP is 4h (the closed form's)")
            want = 72 * tokens * l * h * h * (1 + seq / (6 * h) + V / (12 * l * h))
        end
        local got = program.model_flops(cfg, s)
        T.ok(math.abs(got - want) <= 1e-12 * want, "%s: %.17g FLOPs, Megatron's count %.17g",
             c[1], got, want)
    end
end)

T.test("the model's and the layout's texts: resolved, canonical, every field", function()
    local config = require("config")
    local src = F.source({})
    local a = program.model_text(config.model_from_source(src, "a.lua", "a"))
    local b = program.model_text(config.model_from_source(src, "b/other.lua", "other"))
    T.eq(a, b, "the same model under another file name")
    T.ok(a:find("\nffn_hidden=256\n", 1, true) and a:find("\nnorm_eps=1e-05\n", 1, true) and
         a:find("\nmoe=none\n", 1, true), "defaults filled in: %s", a)
    T.ok(not a:find("name=") and not a:find("file=") and not a:find("description="),
         "where the model was written is not in it: %s", a)
    for _, f in ipairs({ { vocab = 128 }, { seq_len = 32 }, { init_std = 0.01 },
                         { add_bias_linear = false }, { moe = { experts = 4, top_k = 2 } } }) do
        T.ok(program.model_text(F.model(f)) ~= a, "a model with %s differs",
             next(f))
    end
    local moe = program.model_text(F.model({ add_bias_linear = false,
                                             moe = { experts = 4, top_k = 2 } }))
    T.ok(moe:find("\nmoe=yes\nmoe.experts=4\nmoe.top_k=2\n", 1, true), "MoE fields: %s", moe)
    local base = program.layout_text(F.config({}, { tp = 2, dp = 2 }))
    T.eq(program.layout_text(F.config({}, { tp = 2, dp = 2, order = "tp-cp-ep-dp-pp" })), base,
         "the default order given")
    local other = program.layout_text(F.config({}, { tp = 2, dp = 2, order = "dp-tp-cp-ep-pp" }))
    T.eq(other:gsub("order=[%w-]+", ""), (base:gsub("order=[%w-]+", "")),
         "another order: only its line differs")
    T.ok(other ~= base, "another order differs")
    for _, o in ipairs({ { tp = 2, dp = 2, sp = true }, { tp = 2, dp = 2, dist_opt = true },
                         { tp = 2, dp = 2, bf16 = true }, { tp = 2, pp = 2 } }) do
        T.ok(program.layout_text(F.config({}, o)) ~= base, "a layout differs")
    end
end)

T.done()
