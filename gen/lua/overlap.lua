-- overlap.lua: where a stage's asynchronous communication starts and where it is waited
-- (docs/megatron.md §5.3-5.4, Megatron's --overlap-grad-reduce and --overlap-param-gather):
--   * the data-parallel reduction of each gradient bucket (all-reduce, or reduce-scatter with
--     the distributed optimizer) starts as soon as the step's last micro-batch has written
--     every gradient of the bucket (right after that layer's backward, the embedding's, or the
--     head's), scaled by 1/(DP*CP) first; the step waits for all of them, in start order,
--     before the sequence-parallel and embedding all-reduces and the norm;
--   * with the distributed optimizer, the all-gather of each bucket's updated parameters starts
--     after AdamW, in the order the next step's forward needs them, and is waited just before
--     the first forward call (micro-batch 0) that reads one of its parameters; the library
--     waits for any still in flight before it reads parameters between steps (gpt_stage.sync).
-- With cfg.overlap off, each starts where it is waited: the same collectives with the same
-- operands, so the same numbers. A pure pass over the stage's tables and schedule; every
-- placement is checked by verify.check_async.
--
-- overlap.plan(cfg, s, st, buffers, schedule, groups_by_id) -> Overlap; overlap.events(sp, cfg)
-- -> the stage's two steps as events for verify.check_async.

local ir = require("ir")
local layer = require("layer")

local M = {}

-- The element ranges, per buffer, of the tensors a call reads (params) and writes (grads):
-- a layer's (every tensor of its table at its base), the embedding's, the head's.
local EMBEDDING = { WTE = true, WPE = true }
local HEAD = { LN_F_W = true, LN_F_B = true, HEAD_WTE = true, LM_HEAD = true }

local function layer_ranges(params, ch, j)
    local out = {}
    for r, p in ipairs(params) do
        local lo = ch.bases[j + 1][p.buf + 1] + p.offset + (ch.shifts and ch.shifts[j + 1][r] or 0)
        out[#out + 1] = { buf = p.buf, lo = lo, hi = lo + p.n }
    end
    return out
end

local function other_ranges(others, set, tied)
    local out = {}
    for _, p in ipairs(others) do
        if set[p.field] or (tied and p.field == "WTE") then
            out[#out + 1] = { buf = p.buf, lo = p.offset, hi = p.offset + p.n }
        end
    end
    return out
end

-- The tensors a call of chunk ci touches: reads (parameters), writes (gradients). 'st' holds
-- the stage's tables as StageProgram names them: layer_params[ci], chunks[ci] (bases, shifts),
-- other_params, head_uses_wte.
function M.call_ranges(call, ci, st)
    local op, others = call.op, st.other_params
    if op == "layer_fwd" or op == "layer_recompute" then
        return layer_ranges(st.layer_params[ci], st.chunks[ci], call.layer), {}
    elseif op == "layer_bwd" then
        local r = layer_ranges(st.layer_params[ci], st.chunks[ci], call.layer)
        return r, r
    elseif op == "embedding_fwd" then
        return other_ranges(others, EMBEDDING), {}
    elseif op == "embedding_bwd" then
        return other_ranges(others, EMBEDDING), other_ranges(others, EMBEDDING)
    elseif op == "head_fwd_bwd" then
        local r = other_ranges(others, HEAD, st.head_uses_wte)
        return r, r
    end
    error("overlap: no call " .. op)
end

local function meets(ranges, buf, lo, hi)
    for _, r in ipairs(ranges) do
        if r.buf == buf and r.lo < hi and lo < r.hi then return true end
    end
    return false
end

-- The first F op and the last B op of each chunk in the schedule: where micro-batch 0 first
-- reads the parameters and where the step's last micro-batch writes the gradients.
local function chunk_ops(schedule, nmb)
    local first_f, last_f, last_b = {}, {}, {}
    for _, o in ipairs(schedule) do
        if o.kind == "F" then
            first_f[o.chunk] = first_f[o.chunk] or o
            last_f[o.chunk] = o
        elseif o.kind == "B" then
            last_b[o.chunk] = o
        end
    end
    for c, o in pairs(first_f) do
        assert(o.mb == 0 and last_f[c].mb == nmb - 1 and (not last_b[c] or last_b[c].mb == nmb - 1),
               "overlap: chunk " .. c .. "'s micro-batches do not run in order")
    end
    return first_f, last_f, last_b
end

--[[
** The plan of a stage: st (its tables: M.call_ranges), buffers (ProgBuffer), schedule (Op list,
** F and B with their calls). Returns an Overlap:
**   items[ci] = { fwd, bwd }: each chunk's calls with the async statements between them,
**     ChunkItem records (when = "first": only on micro-batch 0; "last": only on the step's last);
**   reduce, gather: AsyncOp lists (in start order), nreq: request slots.
]]
function M.plan(cfg, s, st, buffers, schedule, groups_by_id)
    local A = layer.arg
    local chunks = st.chunks
    local first_f, last_f, last_b = chunk_ops(schedule, cfg.nmb)
    local ops = { reduce = {}, gather = {}, scale_only = {} }
    -- each chunk's calls (as every F and B op of it has them)
    local calls = {}
    for ci, c in ipairs(chunks) do
        local f, b = first_f[c.vp], last_b[c.vp]
        calls[ci] = { F = f and f.calls or {}, B = b and b.calls or {} }
    end
    local ci_of = {}
    for ci, c in ipairs(chunks) do ci_of[c.vp] = ci end

    -- per bucket: after which call the last micro-batch has written all of its gradients,
    -- and before which call micro-batch 0 first reads its parameters
    local dp = cfg.dp * cfg.cp > 1
    for bi, bf in ipairs(buffers) do
        local g = groups_by_id[bf.group]
        local ci = ci_of[bf.chunk]
        for k, bk in ipairs(bf.buckets) do
            local lo, hi = bk.start, bk.start + bk.size
            local ready, first
            for _, phase in ipairs({ "F", "B" }) do
                for i, call in ipairs(calls[ci][phase]) do
                    local _, w = M.call_ranges(call, ci, st)
                    if meets(w, bi - 1, lo, hi) then ready = { phase = phase, call = i } end
                end
            end
            for i, call in ipairs(calls[ci].F) do
                local rd = M.call_ranges(call, ci, st)
                if not first and meets(rd, bi - 1, lo, hi) then first = { phase = "F", call = i } end
            end
            local what = string.format("buffer %d (chunk %d, %s), bucket %d", bi - 1, bf.chunk,
                                       bf.expert and "experts" or "dense", k - 1)
            local function op(kind, at)
                return { kind = kind, buf = bi - 1, bucket = k - 1, group = g.kind, what = what,
                         lo = lo, hi = hi, at = at.phase .. at.call, chunk = ci - 1, bk = bk,
                         sharded = bf.sharded }
            end
            if g.create and ready then
                ops.reduce[#ops.reduce + 1] = op("reduce", ready)
            elseif ready and dp then
                -- no group to reduce over (expert buffers when EDP is 1): the mean's scale only
                ops.scale_only[#ops.scale_only + 1] = { buf = bi - 1, bucket = bk }
            end
            if cfg.dist_opt and g.create and first then
                ops.gather[#ops.gather + 1] = op("gather", first)
            end
        end
    end
    -- the reductions start in the order they become ready (the schedule's position of the op
    -- and the call), the all-gathers in the order the next forward first reads them; a stable
    -- sort keeps bucket order within a call. Request slots: the reductions 0 .. R-1, then the
    -- all-gathers, each in start order
    local index = {}
    for i, o in ipairs(schedule) do index[o] = i end
    local function key(op)
        local phase, call = op.at:match("^(%a)(%d+)$")
        local c = chunks[op.chunk + 1].vp
        local o = op.kind == "gather" and first_f[c] or (phase == "F" and last_f[c] or last_b[c])
        return index[o] * 100000 + tonumber(call)
    end
    local nreq = 0
    for _, list in ipairs({ ops.reduce, ops.gather }) do
        local kk, seq = {}, {}
        for i, op in ipairs(list) do kk[op], seq[op] = key(op), i end
        table.sort(list, function(x, y)
            if kk[x] ~= kk[y] then return kk[x] < kk[y] end
            return seq[x] < seq[y]
        end)
        for i, op in ipairs(list) do
            op.req = nreq
            nreq = nreq + 1
            -- the statement: a call of the stage's helper (grad_reduce_start,
            -- param_gather_start), with the collective it starts for the verifier and the trace
            local bk, coll = op.bk, nil
            if op.kind == "reduce" and op.sharded then
                coll = { op = "reduce_scatter", n = bk.shard, n_expr = A.E(s, bk.shard),
                         dtype = "f32" }
            elseif op.kind == "reduce" then
                coll = { op = "allreduce", n = bk.size, n_expr = A.E(s, bk.size), dtype = "f32",
                         red = "sum" }
            else
                coll = { op = "allgather", n = bk.shard, n_expr = A.E(s, bk.shard),
                         dtype = cfg.bf16 and "bf16" or "f32" }
            end
            coll.op, coll.group = coll.op, op.group
            local b = layer.builder()
            b.stmts[1] = ir.Stmt {
                kind = "S", req = op.req, coll = ir.Coll(coll),
                fn = op.kind == "reduce" and "grad_reduce_start" or "param_gather_start",
                args = { A.int(A.E(s, op.req)), A.int(A.E(s, op.buf)), A.int(A.E(s, op.bucket)) },
                text = string.format(">>> buffer %d, bucket %d%s", op.buf, op.bucket,
                                     op.group == "expt-dp" and " (experts)" or ""),
            }
            op.stmts = b.stmts
            op.bk, op.sharded = nil, nil
            list[i] = ir.AsyncOp(op)
        end
    end
    -- where each goes
    local after, before = {}, {}
    for ci = 1, #chunks do after[ci], before[ci] = { F = {}, B = {} }, { F = {}, B = {} } end
    if cfg.overlap then
        for _, op in ipairs(ops.reduce) do
            local phase, call = op.at:match("^(%a)(%d+)$")
            local list = after[op.chunk + 1][phase]
            call = tonumber(call)
            list[call] = list[call] or {}
            table.insert(list[call], op)
        end
        for _, op in ipairs(ops.gather) do
            local call = tonumber(op.at:match("^F(%d+)$"))
            local list = before[op.chunk + 1].F
            list[call] = list[call] or {}
            table.insert(list[call], op)
        end
    end

    -- each chunk's code: its calls with the statements after (the last micro-batch's) and
    -- before (micro-batch 0's) them
    local items = {}
    for ci = 1, #chunks do
        items[ci] = {}
        for _, phase in ipairs({ "F", "B" }) do
            local list = {}
            for i, call in ipairs(calls[ci][phase]) do
                for _, op in ipairs(before[ci][phase][i] or {}) do
                    list[#list + 1] = ir.ChunkItem { kind = "wait", when = "first", op = op }
                end
                list[#list + 1] = ir.ChunkItem { kind = "call", call = call }
                for _, op in ipairs(after[ci][phase][i] or {}) do
                    list[#list + 1] = ir.ChunkItem { kind = "start", when = "last", op = op }
                end
            end
            items[ci][phase] = list
        end
    end
    return ir.Overlap { items = items, reduce = ops.reduce, gather = ops.gather, nreq = nreq,
                        scale_only = ops.scale_only,
                        progress = cfg.overlap and (#ops.reduce + #ops.gather) > 0 }
end

-- -- The stage's two steps as events (verify.check_async) ---------------------------------------

-- What the step's tail ops touch, conservatively: every gradient or parameter of the stage
-- ("r" read, "w" written). The asynchronous statements (S, WAIT) inside an op are events of
-- their own; an op kind not listed is an error, so a new tail op must say what it touches.
local TAIL = {
    BEGIN = { grads = "w" },                 -- zeroes every gradient
    DP_WAIT = {}, DP_REDUCE = { grads = "w" }, GRAD_SCALE = { grads = "w" },
    SP_ALLREDUCE = { grads = "w" }, EMBD_ALLREDUCE = { grads = "w" },
    NORM_LOCAL = { grads = "r" }, NORM_ALLREDUCE = {}, NORM = {}, AUX_ALLREDUCE = {},
    LOSS_ALLREDUCE = {}, ADAMW = { grads = "r", params = "w" }, PARAM_ALLGATHER = {},
    EXPERT_BIAS = {},                        -- the expert bias is not a parameter (§8.1)
}
local ALL = { { all = true } }

local CALL_WHAT = { embedding_fwd = "embedding_fwd", embedding_bwd = "embedding_bwd",
                    head_fwd_bwd = "head_fwd_bwd" }
local function call_name(c)
    return CALL_WHAT[c.op] or string.format("%s (layer %d)", c.op, c.global)
end

--[[
** The events of stage sp over two steps, in the order its code runs them: each call with the
** ranges it reads (params) and writes (grads), each start (with the bucket it covers) and each
** wait, where each is ("step 2, backward of micro-batch 3, chunk 0: after layer_bwd (layer 4)").
** Event: { where, params = { ranges }, grads = { ranges }, pmode, gmode ("r"/"w"), start =
** AsyncOp, wait = req }. A range { buf, lo, hi } or { all = true }.
]]
function M.events(sp, cfg)
    local ops_of = {}
    for _, a in ipairs(sp.overlap.reduce) do ops_of[a.req] = a end
    for _, a in ipairs(sp.overlap.gather) do ops_of[a.req] = a end
    local ci_of = {}
    for ci, c in ipairs(sp.chunks) do ci_of[c.vp] = ci end
    local ev = {}
    -- Calls only read what is in flight, which only starts and waits change (the first and
    -- last micro-batch's): a chunk's forward or backward is listed once per such change, not
    -- once per micro-batch (NMB of them would only repeat the same checks).
    local epoch, listed = 0, {}
    for step = 1, 2 do
        for _, t in ipairs(sp.tail) do
            if t.kind == "SCHEDULE" then
                for _, o in ipairs(sp.schedule) do
                    local ci = ci_of[o.chunk]
                    local key = (o.kind == "F" or o.kind == "B") and o.kind .. ci
                    local ends = o.mb == 0 or o.mb == cfg.nmb - 1     -- may start or wait
                    if key and (ends or listed[key] ~= epoch) then
                        if not ends then listed[key] = epoch end
                        local where = string.format("step %d, %s of micro-batch %d (chunk %d)",
                            step, o.kind == "F" and "forward" or "backward", o.mb, o.chunk)
                        for _, it in ipairs(sp.overlap.items[ci][o.kind]) do
                            if it.kind == "call" then
                                local rd, wr = M.call_ranges(it.call, ci, sp)
                                ev[#ev + 1] = { where = where .. ": " .. call_name(it.call),
                                                params = rd, pmode = "r", grads = wr,
                                                gmode = "w" }
                            elseif it.kind == "start" and o.mb == cfg.nmb - 1 then
                                ev[#ev + 1] = { where = where, start = it.op }
                            elseif it.kind == "wait" and o.mb == 0 then
                                ev[#ev + 1] = { where = where, wait = it.op.req, param_wait = true }
                            end
                        end
                        if ends then epoch = epoch + 1 end
                    end
                end
            else
                epoch = epoch + 1
                local touch = assert(TAIL[t.kind], "overlap: what does tail op " .. t.kind ..
                                     " touch?")
                local where = string.format("step %d, the tail's %s", step, t.kind)
                local async = false
                for _, st in ipairs(t.stmts or {}) do
                    if st.kind == "S" then
                        async = true
                        ev[#ev + 1] = { where = where, start = assert(ops_of[st.req]) }
                    elseif st.kind == "WAIT" then
                        async = true
                        for k = st.req, st.req + st.nreq - 1 do
                            ev[#ev + 1] = { where = where, wait = k }
                        end
                    elseif not async then
                        -- the op's own work, before its start (DP_REDUCE's scale)
                        ev[#ev + 1] = { where = where, params = touch.params and ALL or {},
                                        pmode = touch.params, grads = touch.grads and ALL or {},
                                        gmode = touch.grads }
                    end
                end
                if not t.stmts or #t.stmts == 0 then
                    ev[#ev + 1] = { where = where, params = touch.params and ALL or {},
                                    pmode = touch.params, grads = touch.grads and ALL or {},
                                    gmode = touch.grads }
                end
            end
        end
        ev[#ev + 1] = { where = string.format("the end of step %d", step), step_end = step }
    end
    ev.plan = sp.overlap
    return ev
end

return M
