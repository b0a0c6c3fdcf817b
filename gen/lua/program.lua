-- program.lua: the training program of one output directory, as plain records that the
-- templates under templates/program/ print (docs/PROGRAM.md).
--
-- program.build(cfg, topo, part, sh) -> Program. Pure: it decides every number, name, buffer
-- offset, piece table and schedule step of the generated C, verifies the pipeline schedule
-- (verify.lua) and raises a user error with a counterexample if it could hang. Templates only
-- print what is here. No I/O.

local diag = require("diag")
local schedule = require("schedule")
local shards = require("shards")
local topology = require("topology")
local util = require("util")
local verify = require("verify")

local M = {}

-- -- Formatting helpers ------------------------------------------------------------------------

-- A float as a C literal ("1.0f", not "1f").
local function cfloat(x)
    local t = string.format("%.9g", x)
    if not t:find("[.eEn]") then t = t .. ".0" end
    return t .. "f"
end

local function int(x)
    assert(math.type(x) == "integer", "program: expected an integer")
    return string.format("%d", x)
end

-- FNV-1a 64 of a string, as a C literal (the stream of a tensor's random values).
local function fnv1a64(s)
    local h = 0xcbf29ce484222325
    for i = 1, #s do
        h = h ~ s:byte(i)
        h = h * 0x100000001b3          -- wraps modulo 2^64 like the C version
    end
    return string.format("0x%016xull", h)
end
M.fnv1a64 = fnv1a64

-- Constant records for model.h, aligned: {name, value, comment}.
local function const_table(list)
    local w1, w2 = 0, 0
    for _, c in ipairs(list) do
        w1, w2 = math.max(w1, #c[1]), math.max(w2, #c[2])
    end
    local out = {}
    for i, c in ipairs(list) do
        out[i] = { name = c[1] .. string.rep(" ", w1 - #c[1]),
                   value = c[2] .. string.rep(" ", w2 - #c[2]), comment = c[3] }
    end
    return out
end

-- -- Parameters ----------------------------------------------------------------------------------

-- Struct field of each per-layer parameter role (model.h layer_params).
local LAYER_FIELD = {
    ["ln_1.weight"] = "ln_1_w", ["ln_1.bias"] = "ln_1_b",
    ["attn.c_attn.weight"] = "c_attn_w", ["attn.c_attn.bias"] = "c_attn_b",
    ["attn.c_proj.weight"] = "attn_proj_w", ["attn.c_proj.bias"] = "attn_proj_b",
    ["ln_2.weight"] = "ln_2_w", ["ln_2.bias"] = "ln_2_b",
    ["mlp.c_fc.weight"] = "c_fc_w", ["mlp.c_fc.bias"] = "c_fc_b",
    ["mlp.c_proj.weight"] = "mlp_proj_w", ["mlp.c_proj.bias"] = "mlp_proj_b",
}

-- Fields of the MoE roles (model.h moe_params); experts are indexed by their local number.
local MOE_FIELD = {
    ["mlp.router.weight"] = "moe.router_w",
    ["mlp.experts.c_fc.weight"] = "moe.fc_w", ["mlp.experts.c_fc.bias"] = "moe.fc_b",
    ["mlp.experts.c_proj.weight"] = "moe.proj_w", ["mlp.experts.c_proj.bias"] = "moe.proj_b",
}

-- The C lvalues of a parameter and of its gradient in a stage source. 'nl': local experts.
local function param_lvalues(p, chunk_first, nl)
    if p.layer then
        local j = p.layer - chunk_first
        local f = LAYER_FIELD[p.role] or MOE_FIELD[p.role]
        assert(f, "program: no field for " .. p.role)
        if p.expert_id then f = string.format("%s[%d]", f, p.expert_id % nl) end
        return string.format("chunk%d_params[%d].%s", p.chunk, j, f),
               string.format("chunk%d_grads[%d].%s", p.chunk, j, f)
    end
    local map = { ["wpe.weight"] = "embed_p.wpe", ["ln_f.weight"] = "head_p.ln_f_w",
                  ["ln_f.bias"] = "head_p.ln_f_b" }
    local lv
    if p.role == "wte.weight" then lv = p.tied and "head_p.wte" or "embed_p.wte"
    else lv = assert(map[p.role], "program: no field for " .. p.role) end
    return lv, (lv:gsub("_p%.", "_g.", 1))
end

-- Hugging Face's order inside a block (module order): c_attn before c_proj. Megatron's
-- named_parameters order (shards.lua) has linear_proj first.
local HF_RANK = { ["attn.c_attn.weight"] = 1, ["attn.c_attn.bias"] = 2,
                  ["attn.c_proj.weight"] = 3, ["attn.c_proj.bias"] = 4 }

local function hf_order(params)
    local out, pending = {}, {}
    local function flush()
        table.sort(pending, function(a, b) return HF_RANK[a.role] < HF_RANK[b.role] end)
        for _, p in ipairs(pending) do out[#out + 1] = p end
        pending = {}
    end
    for _, p in ipairs(params) do
        if HF_RANK[p.role] then pending[#pending + 1] = p
        else flush(); out[#out + 1] = p end
    end
    flush()
    return out
end

-- The whole model's tensors in checkpoint order (Hugging Face GPT-2's: wte, wpe, each block in
-- module order, ln_f), with how each is initialised (issue 4).
local function model_tensors(cfg)
    local m = cfg.model
    local out, index = {}, {}
    local out_std = m.init_std / math.sqrt(2.0 * m.layers)
    for _, p in ipairs(hf_order(shards.global_params(m))) do
        local init, std, r = "INIT_NORMAL", m.init_std, p.role
        if r:match("bias$") then init = "INIT_ZERO"
        elseif r:match("^ln_") then init = "INIT_ONE"
        elseif r:match("c_proj%.weight$") then std = out_std end
        local rows = #p.shape == 2 and p.shape[1] or 1
        local cols = p.shape[#p.shape]
        out[#out + 1] = { name = p.name, rows = int(rows), cols = int(cols),
                          ndim = int(#p.shape), init = init,
                          std = init == "INIT_NORMAL" and cfloat(std) or "0.0f",
                          stream = fnv1a64(p.name) }
        index[p.name] = #out - 1
    end
    return out, index
end

-- -- Groups --------------------------------------------------------------------------------------

-- The group kinds the program uses, with their tables (flat member lists as C text).
local function program_groups(cfg, topo)
    local want = {
        { "tp", "tp", cfg.tp > 1, "tensor-parallel group: layer collectives" },
        { "dpcp", "dp-cp", cfg.dp * cfg.cp > 1, "data-parallel group: gradient reduction" },
        { "pp", "pp", cfg.pp > 1, "pipeline group: neighbours" },
        { "embd", "embd", cfg.pp > 1, "first and last stage: tied embedding gradients" },
        { "mp", "mp", cfg.tp * cfg.pp > 1 and not cfg.dist_opt,
          "model-parallel group (tp-pp): gradient norm" },
    }
    if cfg.model.moe then
        local expert_buffer = cfg.ep > 1 or cfg.etp ~= cfg.tp
        for _, w in ipairs({
            { "ep", "ep", cfg.ep > 1, "expert-parallel group: token all-to-all" },
            { "etp", "expt-tp", cfg.etp > 1, "expert tensor-parallel group: experts' slices" },
            { "edp", "expt-dp", expert_buffer and cfg.edp > 1,
              "expert data-parallel group: expert gradient reduction" },
            { "tpeppn", "tp-ep-pp", expert_buffer and not cfg.dist_opt and
                  cfg.etp * cfg.ep * cfg.pp > 1,
              "expert tp-ep-pp group: gradient norm of the experts" },
        }) do want[#want + 1] = w end
    end
    local out = {}
    for _, w in ipairs(want) do
        local cname, kind_name, used, comment = w[1], w[2], w[3], w[4]
        local kind = topology.kind(topo, kind_name)
        local rows = {}
        for g = 0, kind.count - 1 do
            rows[#rows + 1] = "    " .. table.concat(kind.members, ", ", g * kind.size + 1,
                                                     (g + 1) * kind.size) .. ","
        end
        out[#out + 1] = { cname = cname, name = kind_name, used = used,
                          comment = comment .. (used and "" or " (size 1: not created)"),
                          ngroups = int(kind.count), size = int(kind.size), rows = rows }
    end
    return out
end

-- -- One stage -------------------------------------------------------------------------------------

-- "embedding, layers 0..3 | layers 8..11, head + loss": what each chunk of a stage holds.
function M.stage_title(st)
    local parts = {}
    for _, c in ipairs(st.chunks) do
        local t = c.count == 1 and ("layer " .. c.first)
            or string.format("layers %d..%d", c.first, c.first + c.count - 1)
        if c.embedding then t = "embedding, " .. t end
        if c.head then t = t .. ", head + loss" end
        parts[#parts + 1] = t
    end
    return table.concat(parts, " | ")
end

-- Param records of a class, indexed by name.
local function by_name(params)
    local t = {}
    for _, p in ipairs(params) do t[p.name] = p end
    return t
end

-- The classes holding stage 'r' (one per tp rank, and per ep/etp rank with experts); they
-- share one local layout, which is checked.
local function stage_classes(sh, r)
    local list = {}
    for _, c in ipairs(sh.classes) do
        if c.pp == r then list[#list + 1] = c end
    end
    assert(#list > 0, "program: no class for stage " .. r)
    local ref = list[1]
    for t = 2, #list do
        for bi, b in ipairs(ref.buffers) do
            local o = list[t].buffers[bi]
            assert(o.size == b.size and #o.buckets == #b.buckets and o.kind == b.kind,
                   "program: ranks of one stage differ in buffer layout")
        end
    end
    return list
end

local function chunk_of(st, v) return st.chunks[v + 1] end

-- Describe an exchange op for comments.
local function op_text(op, r, P)
    local peer = schedule.peer(P, r, op.dir)
    local what = op.what == "act" and "activations" or "gradient"
    if op.send then
        return string.format(">>> send %s mb %d (chunk %d) to stage %d", what, op.mb, op.chunk, peer)
    end
    return string.format("<<< recv %s mb %d (chunk %d) from stage %d", what, op.mb, op.chunk, peer)
end

-- The C statements of one stage's schedule.
local function stage_steps(cfg, st, sched_stage, slots, r)
    local P = cfg.pp
    local steps = {}
    local function slot(mb, c) return slots.slot[mb .. "." .. c] end
    local function out_buf(c, mb)
        local ch = chunk_of(st, c)
        return string.format("chunk%d_acts[%d].layer[%d].res2", c, slot(mb, c), ch.count - 1)
    end
    local phase = nil
    local HEADER = { warmup = "warm-up: forward passes only", steady = "steady state: one " ..
                     "forward, one backward", cooldown = "cool-down: backward passes only" }
    for _, s in ipairs(sched_stage.steps) do
        if s.phase ~= phase then
            phase = s.phase
            steps[#steps + 1] = { section = HEADER[phase], is_section = true, fwd = false,
                                  bwd = false, p2p = false }
        end
        local rec = { fwd = false, bwd = false, p2p = false, section = false }
        if s.kind == "F" or s.kind == "B" then
            local ch = chunk_of(st, s.chunk)
            local what = ch.count == 1 and ("layer " .. ch.first)
                or string.format("layers %d..%d", ch.first, ch.first + ch.count - 1)
            if s.kind == "F" then
                if ch.embedding then what = "embedding, " .. what end
                if ch.head then what = what .. ", head + loss (and its backward)" end
            else
                what = string.format("layers %d..%d", ch.first + ch.count - 1, ch.first)
                if ch.count == 1 then what = "layer " .. ch.first end
                if ch.embedding then what = what .. ", embedding" end
            end
            rec.fwd, rec.bwd = s.kind == "F", s.kind == "B"
            rec.comment = string.format("%s mb %d, chunk %d (slot %d): %s",
                                        s.kind == "F" and "forward " or "backward", s.mb,
                                        s.chunk, slot(s.mb, s.chunk), what)
            rec.call = string.format("chunk%d_%s(%d, %d);", s.chunk,
                                     s.kind == "F" and "forward" or "backward", s.mb,
                                     slot(s.mb, s.chunk))
        else
            rec.p2p = true
            local ops, texts = {}, {}
            for _, op in ipairs(s.ops) do
                local buf
                if op.what == "act" then
                    buf = op.send and out_buf(op.chunk, op.mb)
                        or string.format("chunk%d_acts[%d].x", op.chunk, slot(op.mb, op.chunk))
                else
                    buf = string.format("chunk%d_acts[%d].dy", op.chunk, slot(op.mb, op.chunk))
                end
                ops[#ops + 1] = { send = op.send and "1" or "0", buf = buf,
                                  peer = op.dir == "next" and "pp_next" or "pp_prev",
                                  tag = op.what == "act" and "TAG_ACT" or "TAG_GRAD" }
                texts[#texts + 1] = op_text(op, r, P)
            end
            rec.ops, rec.nops = ops, int(#ops)
            rec.comment = table.concat(texts, ";  ")
        end
        rec.is_section = false
        steps[#steps + 1] = rec
    end
    return steps
end

-- Everything stage 'r' needs.
local function build_stage(cfg, topo, part, sh, sched, index, r)
    local st = part.stages[r + 1]
    local classes = stage_classes(sh, r)
    local cls = classes[1]
    local nl = cfg.model.moe and cfg.model.moe.experts // cfg.ep or 1
    local names = by_name(cls.params)
    local slots = schedule.assign_slots(sched.stages[r], cfg.vp)

    -- chunks, their layers and activation slots
    local chunks, max_layers = {}, 1
    for _, c in ipairs(st.chunks) do
        local layers = {}
        for j = 0, c.count - 1 do
            layers[#layers + 1] = { j = int(j), global = int(c.first + j),
                                    prev = j == 0 and "a->x"
                                        or string.format("a->layer[%d].res2", j - 1) }
        end
        local rev = {}
        for i = #layers, 1, -1 do rev[#rev + 1] = layers[i] end
        max_layers = math.max(max_layers, c.count)
        chunks[#chunks + 1] = {
            c = int(c.vp), nlayers = int(c.count), layers = layers, layers_rev = rev,
            embedding = c.embedding, head = c.head, nslots = int(slots.nslots[c.vp]),
            last = int(c.count - 1),
            title = M.stage_title({ chunks = { c } }),
        }
    end

    -- buffers: pointer assignments, optimizer ranges, gradient-sync lists
    local buffers, assigns, ranges, sp_ranges, embd = {}, {}, {}, {}, nil
    for bi, b in ipairs(cls.buffers) do
        local ch = chunk_of(st, b.chunk)
        local buckets = {}
        for _, bk in ipairs(b.buckets) do
            buckets[#buckets + 1] = { start = int(bk.start), size = int(bk.size),
                                      shard = int(bk.shard) }
        end
        local expert = b.kind == "expert"
        buffers[#buffers + 1] = {
            i = int(bi - 1), chunk = int(b.chunk), size = int(b.size), shard = int(b.shard),
            buckets = buckets, nbuckets = int(#buckets), kind = b.kind,
            expert = expert and "1" or "0",
            group = expert and "&grp_edp" or "&grp_dpcp",
            dprank = expert and "&edp_rank" or "&dp_rank",
        }
        for _, bk in ipairs(b.buckets) do
            for _, s in ipairs(bk.slots) do
                local p = names[s.name]
                local lv, gv = param_lvalues(p, ch.first, nl)
                local shape = util.shape(p.local_shape)
                assigns[#assigns + 1] = {
                    param = string.format("%s = pbuf[%d] + %d;", lv, bi - 1, s.offset),
                    grad = string.format("%s = gbuf[%d] + %d;", gv, bi - 1, s.offset),
                    comment = string.format("%s %s", p.name, shape),
                }
                local norm = p.tied and "NORM_NEVER"
                    or (p.tp_sharded and "NORM_ALWAYS" or (p.expert and "NORM_ETP0" or "NORM_TP0"))
                ranges[#ranges + 1] = {
                    buf = int(bi - 1), offset = int(s.offset), n = int(s.numel),
                    decay = #p.shape == 2 and "1" or "0", norm = norm, name = p.name,
                }
                if cfg.sp and p.seq_parallel then
                    sp_ranges[#sp_ranges + 1] = { buf = int(bi - 1), offset = int(s.offset),
                                                  n = int(s.numel), name = p.name }
                end
                if p.shared_embedding then
                    embd = { buf = int(bi - 1), offset = int(s.offset), n = int(s.numel),
                             name = p.tied and "the head's copy of wte.weight"
                                 or "wte.weight" }
                end
            end
        end
    end
    table.sort(assigns, function(a, b) return a.param < b.param end)

    -- pieces of every tp rank (the local layout is shared, the global ranges are not)
    local piece_sets = {}
    for ci, c in ipairs(classes) do
        local list = {}
        for _, p in ipairs(c.params) do
            local ch = chunk_of(st, p.chunk)
            local lv = param_lvalues(p, ch.first, nl)
            local two = #p.shape == 2
            for _, pc in ipairs(p.pieces) do
                list[#list + 1] = {
                    tensor = int(index[p.name]), base = "&" .. lv,
                    ld = int(p.local_shape[#p.local_shape]),
                    lrow = int(two and pc.at[1] or 0), lcol = int(pc.at[#pc.at]),
                    grow = int(two and pc.start[1] or 0), gcol = int(pc.start[#pc.start]),
                    rows = int(two and pc.size[1] or 1), cols = int(pc.size[#pc.size]),
                    replicated = p.tp_sharded and "0" or "1", tied = p.tied and "1" or "0",
                    expert = p.expert and "1" or "0", name = p.name,
                }
            end
        end
        -- the key a rank finds its pieces by (tp_rank, ep_rank, etp_rank); a dense model's
        -- pieces depend on the tp rank only, so its ep and etp are -1: any (its classes carry
        -- 0 there, while its ranks' expert-grid coordinates follow ETP)
        local dense = cfg.model.moe == nil
        piece_sets[#piece_sets + 1] = {
            i = int(ci - 1), tp = int(c.tp), ep = int(dense and -1 or c.ep),
            etp = int(dense and -1 or c.etp), pieces = list, n = int(#list),
            label = dense and string.format("tp %d", c.tp)
                or string.format("tp %d, ep %d, etp %d", c.tp, c.ep, c.etp),
        }
    end

    local max_buckets = 1
    for _, b in ipairs(buffers) do
        local base = 0
        for _, k in ipairs(b.buckets) do
            k.base = int(base)
            base = base + tonumber(k.shard)
        end
        max_buckets = math.max(max_buckets, #b.buckets)
    end
    for _, c in ipairs(chunks) do c.tokens = c.embedding and "1" or "0" end
    local first, last = r == 0, r == cfg.pp - 1
    local pp_stride = topology.rank_of(topo.dense, { pp = 1 })
    return {
        k = int(r), cname = string.format("stage%d_program", r),
        title = string.format("stage %d of %d: %s", r, cfg.pp, M.stage_title(st)),
        chunks = chunks, nchunks = int(#chunks), max_layers = int(max_layers),
        buffers = buffers, nbuffers = int(#buffers), assigns = assigns,
        ranges = ranges, nranges = int(#ranges), sp_ranges = sp_ranges,
        has_sp_ranges = #sp_ranges > 0, nsp = int(#sp_ranges),
        embd = embd, has_embd = embd ~= nil,
        piece_sets = piece_sets, nsets = int(#piece_sets), first = first, last = last,
        has_expert_buffer = (function()
            for _, b in ipairs(buffers) do if b.kind == "expert" then return true end end
            return false
        end)(),
        needs_inputs = first and "1" or "0", needs_targets = last and "1" or "0",
        steps = stage_steps(cfg, st, sched.stages[r], slots, r),
        warmup = int(sched.stages[r].warmup), steady = int(sched.stages[r].steady),
        cooldown = int(sched.stages[r].cooldown), inflight = int(slots.inflight),
        pp_stride = int(pp_stride), max_buckets = int(max_buckets),
        last_int = last and "1" or "0", pipelined = cfg.pp > 1,
        schedule_title = cfg.pp == 1 and
            string.format("no pipelining, %d micro-batches (gradient accumulation)", cfg.nmb)
            or string.format("%s, %d micro-batches", cfg.vp > 1 and
                             ("interleaved 1F1B over " .. cfg.vp .. " chunks") or "1F1B", cfg.nmb),
    }
end

-- -- Verification ----------------------------------------------------------------------------------

-- Append the collectives that cross stages after the schedule (so the checker sees them too).
local function with_tail(cfg, sched)
    local P = cfg.pp
    local all = {}
    for r = 0, P - 1 do all[#all + 1] = r end
    local out = { P = sched.P, V = sched.V, M = sched.M, stages = {} }
    for r = 0, P - 1 do
        local steps = {}
        for i, s in ipairs(sched.stages[r].steps) do steps[i] = s end
        if P > 1 and (r == 0 or r == P - 1) then
            steps[#steps + 1] = { kind = "C", group = "embd", members = { 0, P - 1 },
                                  name = "all-reduce of the tied embedding gradient" }
        end
        steps[#steps + 1] = { kind = "C", group = "norm", members = all,
                              name = "all-reduce of the gradient norm" }
        steps[#steps + 1] = { kind = "C", group = "world", members = all,
                              name = "all-reduce of the loss" }
        out.stages[r] = { steps = steps }
    end
    return out
end

local function check_schedule(cfg, topo, sched)
    local pp = topology.kind(topo, "pp")
    local names = {}
    for r = 0, cfg.pp - 1 do
        names[r] = string.format("stage %d (rank %d)", r, pp.members[r + 1])
    end
    -- the same stage sources run over MPI (messages matched per tag) and NCCL (no tags)
    for _, transport in ipairs({ "mpi", "nccl" }) do
        local ok, why = verify.check(with_tail(cfg, sched), { names = names,
                                                              transport = transport })
        if not ok then
            local lines = {}
            for i, l in ipairs(why) do lines[i] = diag.make(nil, "%s", l) end
            table.insert(lines, 1, diag.make(nil, "the pipeline schedule failed verification " ..
                                             "on %s (a generator bug): nothing written",
                                             transport == "mpi" and "MPI" or "NCCL"))
            diag.raise(lines)
        end
    end
end

-- -- The program -------------------------------------------------------------------------------------

function M.build(cfg, topo, part, sh)
    if cfg.cp > 1 then
        diag.error(nil, "context parallelism (CP=%d) is not supported yet for training " ..
                   "programs; the topology of CP layouts can still be inspected " ..
                   "(make inspect) -- use CP=1", cfg.cp)
    end
    local m = cfg.model
    if m.moe and cfg.tp > 1 and not cfg.sp then
        diag.error(nil, "mixture of experts with TP (%d) > 1 needs sequence parallelism: " ..
                   "add SP=1 (Megatron refuses to train MoE with tensor parallelism without it)",
                   cfg.tp)
    end
    local sched = schedule.build(cfg.pp, cfg.vp, cfg.nmb)
    check_schedule(cfg, topo, sched)

    local T, B, C, TP = cfg.seq, cfg.mbs, m.hidden, cfg.tp
    local N = T * B
    local N_SP = cfg.sp and N // TP or N
    local hd = C // m.heads
    local VL = cfg.vocab_padded // TP
    local layout = string.format("tp%d pp%d dp%d", cfg.tp, cfg.pp, cfg.dp)
    if cfg.cp > 1 then layout = layout .. " cp" .. cfg.cp end
    if cfg.vp > 1 then layout = layout .. " vp" .. cfg.vp end
    local consts = {
        { "CFG_WORLD", int(cfg.world), "ranks = tp*cp*dp*pp" },
        { "CFG_LAYOUT", '"' .. layout .. '"', "for messages" },
        { "CFG_TP", int(cfg.tp), "tensor-parallel size (TP)" },
        { "CFG_PP", int(cfg.pp), "pipeline stages (PP)" },
        { "CFG_DP", int(cfg.dp), "data-parallel size (DP)" },
        { "CFG_VP", int(cfg.vp), "virtual chunks per stage (VP)" },
        { "CFG_B", int(B), "micro-batch size (MBS)" },
        { "CFG_NMB", int(cfg.nmb), "micro-batches per step (NMB)" },
        { "CFG_GBS", int(B * cfg.nmb * cfg.dp), "global batch = MBS*NMB*DP" },
        { "CFG_T", int(T), "sequence length (SEQ)" },
        { "CFG_T_MODEL", int(m.seq_len), "rows of wpe (model.seq_len)" },
        { "CFG_C", int(C), "channels (model.hidden)" },
        { "CFG_N", int(N), "tokens per micro-batch = T*B" },
        { "CFG_N_SP", int(N_SP), cfg.sp and "tokens per tp rank under SP = N/TP"
            or "tokens held between layers (= N, no SP)" },
        { "CFG_HEADS", int(m.heads), "attention heads (model.heads)" },
        { "CFG_HEADS_LOCAL", int(m.heads // TP), "heads per tp rank = heads/TP" },
        { "CFG_HEAD_DIM", int(hd), "channels per head = C/heads" },
        { "CFG_C_LOCAL", int(C // TP), "attention channels per tp rank = C/TP" },
        { "CFG_QKV_LOCAL", int(3 * C // TP), "q|k|v columns per tp rank = 3C/TP" },
        { "CFG_FF", int(m.ffn_hidden), "MLP width (model.ffn_hidden)" },
        { "CFG_FF_LOCAL", int(m.ffn_hidden // TP), "MLP columns per tp rank = FF/TP" },
        { "CFG_V", int(m.vocab), "vocabulary (model.vocab)" },
        { "CFG_V_PADDED", int(cfg.vocab_padded),
          string.format("vocabulary padded to a multiple of %d*TP", m.vocab_pad) },
        { "CFG_V_LOCAL", int(VL), "vocabulary rows per tp rank = V_PADDED/TP" },
        { "CFG_LN_EPS", cfloat(m.norm_eps), "LayerNorm eps (model.norm_eps)" },
        { "CFG_ATT_SCALE", cfloat(1 / math.sqrt(hd)), "1/sqrt(head_dim)" },
        { "CFG_DLOSS", cfloat(1 / (N * cfg.nmb)), "d(step loss)/d(token loss) = 1/(N*NMB)" },
        { "CFG_GRAD_SCALE", cfloat(1 / (cfg.dp * cfg.cp)), "1/(DP*CP): data-parallel mean" },
        { "CFG_TOKENS_PER_STEP", int(B * cfg.nmb * cfg.dp * T), "GBS*T" },
        { "CFG_P2P_N", int(N_SP * C), "elements of one pipeline message = N_SP*C" },
    }
    local moe = m.moe
    if moe then
        local E, K = moe.experts, moe.top_k
        local nl = E // cfg.ep
        local send = N_SP * K
        for _, c in ipairs({
            { "CFG_EXPERTS", int(E), "experts per MoE layer (model.moe.experts)" },
            { "CFG_TOPK", int(K), "experts per token (model.moe.top_k)" },
            { "CFG_EP", int(cfg.ep), "expert-parallel size (EP)" },
            { "CFG_ETP", int(cfg.etp), "expert tensor-parallel size (ETP)" },
            { "CFG_EXPERTS_LOCAL", int(nl), "experts per EP rank = EXPERTS/EP" },
            { "CFG_EFF", int(moe.ffn_hidden), "expert MLP width (model.moe.ffn_hidden)" },
            { "CFG_EFF_LOCAL", int(moe.ffn_hidden // cfg.etp), "expert columns per ETP rank" },
            { "CFG_PRE_SOFTMAX", moe.pre_softmax and "1" or "0",
              "probabilities: softmax before top-k (1) or over the top k (0)" },
            { "CFG_AUX_SCALE", cfloat(moe.aux_loss_coeff * E / (K * N * N)),
              "aux loss = AUX_SCALE * sum_e (sum of scores) * count_e = coeff*E/(K*N^2)" },
            { "CFG_AUX_GRAD", cfloat(1 / cfg.nmb), "the aux loss's share of the objective: 1/NMB" },
            { "CFG_CAPACITY", int(moe.capacity_factor and
                  math.ceil((N * K / E) * moe.capacity_factor) or N * K),
              moe.capacity_factor and "assignments an expert keeps per micro-batch " ..
                  "= ceil(N*K/EXPERTS * capacity_factor)" or "no capacity limit" },
            { "CFG_MOE_SEND_MAX", int(send), "rows this rank sends at most = N_SP*TOPK" },
            { "CFG_MOE_RECV_MAX", int(send * cfg.ep), "rows it receives at most = SEND_MAX*EP" },
            { "CFG_MOE_ROWS_MAX", int(send * cfg.ep * cfg.etp),
              "rows at its experts at most = RECV_MAX*ETP" },
            { "CFG_MOE_COUNTS", int((TP + 1) * E + (cfg.etp + 3) * cfg.ep * nl),
              "ints of count exchanges" },
        }) do consts[#consts + 1] = c end
    end
    consts = const_table(consts)

    local tensors, index = model_tensors(cfg)
    local stages = {}
    for r = 0, cfg.pp - 1 do
        stages[#stages + 1] = build_stage(cfg, topo, part, sh, sched, index, r)
    end

    -- rank -> stage and coordinates
    local stage_rows, coord_rows, line = {}, {}, {}
    for rk = 0, cfg.world - 1 do
        local c = topology.coords(topo, rk)
        line[#line + 1] = string.format("%d,", c.pp)
        if #line == 32 or rk == cfg.world - 1 then
            stage_rows[#stage_rows + 1] = "    " .. table.concat(line, " ")
            line = {}
        end
        coord_rows[#coord_rows + 1] = string.format("    { %d, %d, %d, %d, %d, %d, %d },", c.tp,
                                                    c.pp, c.dp, c.cp, c.ep, c.etp, c.edp)
    end
    local vocab_valid = {}
    for t = 0, TP - 1 do
        local start = t * VL
        vocab_valid[#vocab_valid + 1] = int(math.max(0, math.min(m.vocab - start, VL)))
    end

    return {
        tp = TP > 1, sp = cfg.sp, dist_opt = cfg.dist_opt, pp = cfg.pp > 1,
        consts = consts, tensors = tensors, ntensors = int(#tensors),
        groups = program_groups(cfg, topo), stages = stages,
        stage_rows = stage_rows, coord_rows = coord_rows,
        vocab_valid = table.concat(vocab_valid, ", "),
        layout = layout, schedule_kind = sched.kind,
        dpcp = cfg.dp * cfg.cp > 1, mp = cfg.tp * cfg.pp > 1,
        moe = moe ~= nil, moe_ep = moe ~= nil and cfg.ep > 1,
        moe_etp = moe ~= nil and cfg.etp > 1, moe_tp = moe ~= nil and TP > 1,
        capacity = moe ~= nil and moe.capacity_factor ~= nil,
        bias = moe ~= nil and moe.bias, pre_softmax = moe ~= nil and moe.pre_softmax,
        edp = moe ~= nil and (cfg.ep > 1 or cfg.etp ~= cfg.tp) and cfg.edp > 1,
        tpeppn = moe ~= nil and (cfg.ep > 1 or cfg.etp ~= cfg.tp) and not cfg.dist_opt and
                 cfg.etp * cfg.ep * cfg.pp > 1,
        run_hint = cfg.world > 1 and string.format("under mpirun -np %d", cfg.world)
            or "one rank: run it directly",
    }
end

return M
