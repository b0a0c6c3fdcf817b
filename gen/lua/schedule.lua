-- schedule.lua: the pipeline schedule of every stage, unrolled (docs/megatron.md §3).
--
-- A pure pass: schedule.build(P, V, M, N) returns a Schedule record (ir.lua) holding, for every
-- pipeline stage, the straight-line list of Steps Megatron's forward_backward_* functions
-- execute for one training step:
--   Step{kind="F", k=, mb=, chunk=}         forward of micro-batch mb through local chunk
--   Step{kind="B", k=, mb=, chunk=}         backward of the same
--   Step{kind="X", ops={Exchange, ...}}     one batched exchange (posted and completed together)
-- where Exchange{send=, dir="prev"|"next", what="act"|"grad", mb=, chunk=} names the
-- micro-batch and the *local* chunk of the tensor on this stage: for a send, the chunk that
-- produced it; for a receive, the chunk that will consume it. Peers are pipeline neighbours
-- (wrapping: the last stage's "next" is stage 0). Ops of one exchange are ordered as Megatron's
-- batched _communicate posts them: send prev, recv prev, send next, recv next.
-- The driver builds the schedule once; program.lua, verify.lua, svg.lua and inspect.lua read it.
-- No I/O; schedule.check_sizes raises user errors for Megatron's constraints.

local diag = require("diag")
local ir = require("ir")

local M = {}

-- Virtual stage (global chunk index) of local chunk c on stage r.
function M.virtual_stage(P, r, c)
    return c * P + r
end

-- The stage an exchange op of stage r talks to: its pipeline neighbour in op.dir, wrapping.
function M.peer(P, r, dir)
    if dir == "next" then return (r + 1) % P end
    return (r - 1) % P
end

-- Megatron's schedule table for the interleaved schedule: virtual id k -> (mb, chunk).
-- Micro-batches are walked in groups of N; inside a group every chunk takes all its
-- micro-batches in order (get_schedule_table).
local function schedule_table(Mb, V, N)
    local t = {}
    for g = 0, Mb - 1, N do
        local last = math.min(g + N, Mb) - 1
        for c = 0, V - 1 do
            for mb = g, last do t[#t + 1] = { mb = mb, chunk = c } end
        end
    end
    return t
end
M.schedule_table = schedule_table

-- Appends an exchange built from up to four optional ops, in Megatron's posting order.
local function exchange(steps, send_prev, recv_prev, send_next, recv_next)
    local ops = {}
    local all = { send_prev, recv_prev, send_next, recv_next }
    for i = 1, 4 do   -- not ipairs: any of the four may be absent
        if all[i] then ops[#ops + 1] = all[i] end
    end
    if #ops > 0 then steps[#steps + 1] = ir.Step { kind = "X", ops = ops } end
end

local function op(send, dir, what, mb, chunk)
    return ir.Exchange { send = send, dir = dir, what = what, mb = mb, chunk = chunk }
end

-- Per-chunk FIFO counters: the n-th tensor received for chunk c belongs to its n-th
-- micro-batch, because every chunk consumes its inputs (and output grads) in micro-batch order.
local function counters(V)
    local c = {}
    for i = 0, V - 1 do c[i] = 0 end
    return c
end

local function take(cnt, chunk)
    local mb = cnt[chunk]
    cnt[chunk] = mb + 1
    return mb
end

-- Label steps [from, #steps] with 'phase' (warmup, steady, cooldown) for comments.
local function mark(steps, from, phase)
    for i = from, #steps do steps[i].phase = steps[i].phase or phase end
    return #steps + 1
end

-- No pipelining (P = 1): forward and backward of every micro-batch in turn (gradients
-- accumulate; Megatron's forward_backward_no_pipelining).
local function no_pipelining(Mb)
    local steps = {}
    for mb = 0, Mb - 1 do
        steps[#steps + 1] = ir.Step { kind = "F", k = mb, mb = mb, chunk = 0 }
        steps[#steps + 1] = ir.Step { kind = "B", k = mb, mb = mb, chunk = 0 }
    end
    mark(steps, 1, "steady")
    return ir.StageSchedule { stage = 0, steps = steps, warmup = 0, steady = Mb, cooldown = 0 }
end

-- Non-interleaved 1F1B on stage r (forward_backward_pipelining_without_interleaving).
local function one_f_one_b(P, Mb, r)
    local first, last = r == 0, r == P - 1
    local warmup = math.min(P - r - 1, Mb)
    local steady = Mb - warmup
    local steps = {}
    local nf, nb = 0, 0   -- next forward / backward micro-batch
    local function recv_forward(mb)
        if not first then exchange(steps, nil, op(false, "prev", "act", mb, 0)) end
    end
    local function F()
        steps[#steps + 1] = ir.Step { kind = "F", k = nf, mb = nf, chunk = 0 }
        nf = nf + 1
        return nf - 1
    end
    local function B()
        steps[#steps + 1] = ir.Step { kind = "B", k = nb, mb = nb, chunk = 0 }
        nb = nb + 1
        return nb - 1
    end
    for _ = 1, warmup do
        recv_forward(nf)
        local mb = F()
        if not last then exchange(steps, nil, nil, op(true, "next", "act", mb, 0)) end
    end
    local at = mark(steps, 1, "warmup")
    if steady > 0 then recv_forward(nf) end
    for i = 0, steady - 1 do
        local mb = F()
        -- send_forward_recv_backward: output to next, its gradient back from next
        if not last then
            exchange(steps, nil, nil, op(true, "next", "act", mb, 0),
                     op(false, "next", "grad", nb, 0))
        end
        local bmb = B()
        if i == steady - 1 then
            if not first then exchange(steps, op(true, "prev", "grad", bmb, 0)) end
        elseif not first then
            -- send_backward_recv_forward
            exchange(steps, op(true, "prev", "grad", bmb, 0), op(false, "prev", "act", nf, 0))
        end
    end
    at = mark(steps, at, "steady")
    for _ = 1, warmup do
        if not last then exchange(steps, nil, nil, nil, op(false, "next", "grad", nb, 0)) end
        local bmb = B()
        if not first then exchange(steps, op(true, "prev", "grad", bmb, 0)) end
    end
    mark(steps, at, "cooldown")
    return ir.StageSchedule { stage = r, steps = steps, warmup = warmup, steady = steady,
                              cooldown = warmup }
end

-- Interleaved 1F1B on stage r with V chunks (forward_backward_pipelining_with_interleaving,
-- batched p2p, no overlap).
local function interleaved(P, V, Mb, N, r)
    local first, last = r == 0, r == P - 1
    local table_ = schedule_table(Mb, V, N)
    local total = Mb * V
    local warmup = (P - r - 1) * 2 + (V - 1) * N
    local all_warmup = false
    if warmup >= total then warmup, all_warmup = total, true end
    local remaining = total - warmup

    local function chunk_of(k, forward)
        local c = table_[(k % total) + 1].chunk
        if not forward then c = V - 1 - c end
        return c
    end
    -- recv_tensor_from_previous_stage: does step k receive, and for which chunk?
    local function recv_from_prev(k, forward)
        local leading = forward and first or (not forward and last)
        local last_chunk = forward and V - 1 or 0
        local recv, nxt = true, nil
        if leading then
            if k < P - 1 then
                recv = false
                nxt = chunk_of(k + 1, forward)
            else
                nxt = chunk_of(k - (P - 1), forward)
            end
            if nxt == last_chunk then recv = false end
            nxt = forward and nxt + 1 or nxt - 1
        else
            nxt = chunk_of(k + 1, forward)
        end
        return recv, nxt
    end

    local steps = {}
    local fin, gin = counters(V), counters(V)   -- tensors received per chunk (inputs, grads)
    local function F(k)
        local c = chunk_of(k, true)
        steps[#steps + 1] = ir.Step { kind = "F", k = k, mb = table_[k + 1].mb, chunk = c }
        return c, table_[k + 1].mb
    end
    local bdone = counters(V)
    local function B(k)
        local c = chunk_of(k, false)
        local mb = take(bdone, c)
        steps[#steps + 1] = ir.Step { kind = "B", k = k, mb = mb, chunk = c }
        return c, mb
    end
    local function send_act(c, mb)       -- nil when this is the model's last chunk
        if last and c == V - 1 then return nil end
        return op(true, "next", "act", mb, c)
    end
    local function send_grad(c, mb)      -- nil when this is the model's first chunk
        if first and c == 0 then return nil end
        return op(true, "prev", "grad", mb, c)
    end
    local function recv_act(recv, c)
        if not recv then return nil end
        return op(false, "prev", "act", take(fin, c), c)
    end
    local function recv_grad(recv, c)
        if not recv then return nil end
        return op(false, "next", "grad", take(gin, c), c)
    end

    -- input of the very first forward: received unless this is the model's first chunk
    if not first then exchange(steps, nil, recv_act(true, 0)) end
    for k = 0, warmup - 1 do
        local c, mb = F(k)
        local recv_prev, next_c = recv_from_prev(k, true)
        if k == total - 1 then recv_prev = false end
        if k == warmup - 1 and not all_warmup then
            -- send_forward_backward_recv_forward_backward with no input grad yet
            exchange(steps, nil, recv_act(recv_prev, next_c), send_act(c, mb),
                     recv_grad(not last, V - 1))
        else
            exchange(steps, nil, recv_act(recv_prev, next_c), send_act(c, mb))
        end
    end
    local at = mark(steps, 1, "warmup")
    for i = 0, remaining - 1 do
        local fk, bk = warmup + i, i
        local fc, fmb = F(fk)
        local bc, bmb = B(bk)
        local recv_prev, next_fc = recv_from_prev(fk, true)
        local recv_next, next_bc = recv_from_prev(bk, false)
        if i == remaining - 1 then recv_prev = false end
        exchange(steps, send_grad(bc, bmb), recv_act(recv_prev, next_fc),
                 send_act(fc, fmb), recv_grad(recv_next, next_bc))
    end
    at = mark(steps, at, "steady")
    if all_warmup and not last then exchange(steps, nil, nil, nil, recv_grad(true, V - 1)) end
    for k = remaining, total - 1 do
        local recv_next, next_bc = recv_from_prev(k, false)
        if k == total - 1 then recv_next = false end
        local c, mb = B(k)
        exchange(steps, send_grad(c, mb), nil, nil, recv_grad(recv_next, next_bc))
    end
    mark(steps, at, "cooldown")
    return ir.StageSchedule { stage = r, steps = steps, warmup = warmup, steady = remaining,
                              cooldown = warmup }
end

--[[
** Raise Megatron's schedule constraints as user errors (no location: they are sizes).
** P pipeline stages, V chunks per stage, Mb micro-batches, N micro-batch group size.
]]
function M.check_sizes(P, V, Mb, N)
    local errs = {}
    if Mb < 1 then errs[#errs + 1] = { msg = ("NMB (%d) must be at least 1"):format(Mb) } end
    if V > 1 then
        if P < 2 then
            errs[#errs + 1] = { msg = ("VP (%d) needs PP > 1: the interleaved schedule "
                .. "runs virtual chunks across pipeline stages"):format(V) }
        elseif N < P or N > Mb then
            errs[#errs + 1] = { msg = ("the micro-batch group (%d) must be between PP (%d) "
                .. "and NMB (%d): Megatron requires the contiguous micro-batches of a virtual "
                .. "stage to range in [PP, NMB]"):format(N, P, Mb) }
        elseif Mb % N ~= 0 and Mb % N < P then
            errs[#errs + 1] = { msg = ("NMB (%d) %% the micro-batch group (%d) = %d must be 0 "
                .. "or at least PP (%d): a shorter last group leaves dependency bubbles")
                :format(Mb, N, Mb % N, P) }
        end
    end
    if #errs > 0 then diag.raise(errs) end
end

--[[
** The schedule of every stage: a Schedule record (ir.lua) whose stages[r+1] is stage r's
** StageSchedule; kind is "none", "1f1b" or "interleaved".
]]
function M.build(P, V, Mb, N)
    N = N or P
    M.check_sizes(P, V, Mb, N)
    local stages, kind = {}, nil
    if P == 1 then
        kind = "none"
        stages[1] = no_pipelining(Mb)
    elseif V == 1 then
        kind = "1f1b"
        for r = 0, P - 1 do stages[r + 1] = one_f_one_b(P, Mb, r) end
    else
        kind = "interleaved"
        for r = 0, P - 1 do stages[r + 1] = interleaved(P, V, Mb, N, r) end
    end
    return ir.Schedule { kind = kind, P = P, V = V, M = Mb, N = N, stages = stages }
end

-- The lowest free index of a pool of n: the smallest in 'free' (taken out of it), else a new
-- one, n; returns it and the pool's size after.
local function take_lowest(free, n)
    if #free == 0 then return n, n + 1 end
    table.sort(free)
    return table.remove(free, 1), n
end

--[[
** Activation slots of one stage: a micro-batch occupies a slot of its chunk from the moment
** its input arrives (or its forward starts) until its backward ends, so only in-flight
** micro-batches hold activations. 'pooled': the chunks draw from one pool of slots (a slot
** freed by one chunk's backward serves the next forward of any chunk), so the stage holds as
** many slots as micro-batches in flight at once; else each chunk has slots of its own (as
** many as its own micro-batches in flight: their sum can exceed the stage's peak). The lowest
** free slot is taken first. Returns {slot = {["mb.chunk"] = index (0-based)}, nslots =
** {[chunk] = n} (pooled: the pool's size for every chunk), inflight = peak number of
** micro-batches held at once}.
]]
function M.assign_slots(stage, V, pooled)
    local free, nslots, slot = {}, {}, {}
    for c = 0, V - 1 do free[c], nslots[c] = {}, 0 end
    local function list(c) return pooled and 0 or c end     -- whose free list and count
    local held, peak = 0, 0
    local function acquire(mb, c)
        local key = mb .. "." .. c
        if slot[key] then return end
        slot[key], nslots[list(c)] = take_lowest(free[list(c)], nslots[list(c)])
        held = held + 1
        if held > peak then peak = held end
    end
    for _, st in ipairs(stage.steps) do
        if st.kind == "X" then
            for _, op in ipairs(st.ops) do
                if not op.send and op.what == "act" then acquire(op.mb, op.chunk) end
            end
        elseif st.kind == "F" then
            acquire(st.mb, st.chunk)
        elseif st.kind == "B" then
            local key = st.mb .. "." .. st.chunk
            local f = free[list(st.chunk)]
            f[#f + 1] = slot[key]
            held = held - 1
        end
    end
    if pooled then
        for c = 1, V - 1 do nslots[c] = nslots[0] end
    end
    return { slot = slot, nslots = nslots, inflight = peak }
end

--[[
** Gradient buffers of one stage: the gradient of a micro-batch's chunk output arrives as a
** message from the next stage just before its backward (on the last stage the head's forward
** makes the loss's own), and the backward turns it into its input's gradient in place, which
** goes to the previous stage in the next row's messages (not from stage 0's first chunk). A
** buffer is held from that receive (or forward) to that send (or the backward's end): far
** fewer than the activation slots, since the receives never run ahead of the backward by more
** than a row. Freed buffers return after the row's messages (posted together: a receive never
** lands in a buffer its row sends from); the lowest free one is taken. Returns {dy =
** {["mb.chunk"] = index (0-based)}, n = buffers}.
]]
function M.assign_dy(stage)
    local sent, received = {}, {}
    for _, st in ipairs(stage.steps) do
        if st.kind == "X" then
            for _, op in ipairs(st.ops) do
                local key = op.mb .. "." .. op.chunk
                if op.what == "grad" and op.send then sent[key] = true
                elseif op.what == "grad" then received[key] = true end
            end
        end
    end
    local free, n, dy = {}, 0, {}
    local function acquire(key)
        if not dy[key] then dy[key], n = take_lowest(free, n) end
    end
    for _, st in ipairs(stage.steps) do
        local key = st.mb and (st.mb .. "." .. st.chunk)
        if st.kind == "X" then
            local done = {}
            for _, op in ipairs(st.ops) do
                local k = op.mb .. "." .. op.chunk
                if op.what == "grad" and op.send then done[#done + 1] = dy[k]
                elseif op.what == "grad" then acquire(k) end
            end
            for _, idx in ipairs(done) do free[#free + 1] = idx end
        elseif st.kind == "F" then
            if not received[key] then acquire(key) end     -- the head's forward makes it
        elseif st.kind == "B" then
            acquire(key)
            if not sent[key] then free[#free + 1] = dy[key] end
        end
    end
    return { dy = dy, n = n }
end

-- The compute order of a stage as a compact string ("F0.0 F1.0 B0.0 ..."), for tests and
-- reports: micro-batch, then local chunk when V > 1.
function M.order_string(stage, V)
    local out = {}
    for _, st in ipairs(stage.steps) do
        if st.kind ~= "X" then
            out[#out + 1] = V > 1 and ("%s%d.%d"):format(st.kind, st.mb, st.chunk)
                or ("%s%d"):format(st.kind, st.mb)
        end
    end
    return table.concat(out, " ")
end

return M
