-- tests/lua/schedule_test.lua: the pipeline schedules and their checker.
--  * warm-up counts and compute order of every stage for P=4, M=8 (1F1B and VP=2) equal the
--    tables of docs/megatron.md §3.1/3.2 (r0 and r3 printed there; r1 and r2 derived here
--    from the formulas, by code independent of schedule.lua);
--  * verify.check rejects broken schedules (swapped send/recv, receives out of order, a
--    missing receive, a send before its compute, a shape mismatch, collectives in different
--    orders, a lost backward, an order only NCCL's untagged matching gets wrong) with a
--    message naming the ranks;
--  * it accepts every schedule schedule.build emits for hundreds of random valid sizes, under
--    MPI and NCCL matching, and their activation slots are never shared by two micro-batches
--    in flight;
--  * make inspect RANK=r lists matching sends and receives with concrete peers; the bubble,
--    in-flight counts and slot bytes it reports; schedule.svg; stage sources never duplicate.
-- Run: build/gen --lua tests/lua/schedule_test.lua

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
require("strict")
local T = require("harness")("schedule")
local schedule = require("schedule")
local verify = require("verify")

-- -- Expected orders, from the formulas alone ----------------------------------------------------

-- 1F1B (3.1): warm-up min(P-r-1, M) forwards, then F(w+i) B(i), then the remaining backwards.
local function order_1f1b(P, Mb, r)
    local w = math.min(P - r - 1, Mb)
    local out = {}
    for i = 0, w - 1 do out[#out + 1] = "F" .. i end
    for i = 0, Mb - w - 1 do
        out[#out + 1] = "F" .. (w + i)
        out[#out + 1] = "B" .. i
    end
    for i = Mb - w, Mb - 1 do out[#out + 1] = "B" .. i end
    return table.concat(out, " "), w
end

-- Interleaved (3.2) with N = P: virtual id k -> micro-batch (k div PV)*P + k mod P, chunk
-- (k mod PV) div P forward, V-1 minus that backward; warm-up (P-r-1)*2 + (V-1)*P.
local function order_interleaved(P, V, Mb, r)
    local total = Mb * V
    local w = math.min((P - r - 1) * 2 + (V - 1) * P, total)
    local function mb(k) return (k // (P * V)) * P + k % P end
    local function fc(k) return (k % (P * V)) // P end
    local function F(k) return ("F%d.%d"):format(mb(k), fc(k)) end
    local function B(k) return ("B%d.%d"):format(mb(k), V - 1 - fc(k)) end
    local out = {}
    for k = 0, w - 1 do out[#out + 1] = F(k) end
    for i = 0, total - w - 1 do
        out[#out + 1] = F(w + i)
        out[#out + 1] = B(i)
    end
    for k = total - w, total - 1 do out[#out + 1] = B(k) end
    return table.concat(out, " "), w
end

-- The tables printed in docs/megatron.md §3 (bars and ellipses removed).
local DOC_1F1B = {
    [0] = "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
    [3] = "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
}
local DOC_VP2 = {
    [0] = "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 F5.1 " ..
          "B3.1 F6.1 B0.0 F7.1 B1.0 B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0",
    [3] = "F0.0 F1.0 F2.0 F3.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.0 B0.0 F5.0 B1.0 F6.0 " ..
          "B2.0 F7.0 B3.0 F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 B4.0 B5.0 B6.0 B7.0",
}
-- r1 and r2 as the formulas give them (the document prints them only in part).
local DOC_1F1B_MID = {
    [1] = "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
    [2] = "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
}
local DOC_WARMUP = { ["1f1b"] = { [0] = 3, 2, 1, 0 }, vp2 = { [0] = 10, 8, 6, 4 } }
local DOC_STEADY = { ["1f1b"] = { [0] = 5, 6, 7, 8 }, vp2 = { [0] = 6, 8, 10, 12 } }

T.test("formulas reproduce the printed tables", function()
    for r, want in pairs(DOC_1F1B) do T.eq((order_1f1b(4, 8, r)), want, "1f1b r" .. r) end
    for r, want in pairs(DOC_1F1B_MID) do T.eq((order_1f1b(4, 8, r)), want, "1f1b r" .. r) end
    for r, want in pairs(DOC_VP2) do T.eq((order_interleaved(4, 2, 8, r)), want, "vp2 r" .. r) end
end)

T.test("1F1B P=4 M=8: warm-up, steady, cool-down and order of every stage", function()
    local s = schedule.build(4, 1, 8)
    T.eq(s.kind, "1f1b", "kind")
    for r = 0, 3 do
        local st = s.stages[r + 1]
        T.eq({ st.warmup, st.steady, st.cooldown },
             { DOC_WARMUP["1f1b"][r], DOC_STEADY["1f1b"][r], DOC_WARMUP["1f1b"][r] },
             "counts of r" .. r)
        T.eq(schedule.order_string(st, 1), DOC_1F1B[r] or DOC_1F1B_MID[r], "order of r" .. r)
    end
end)

T.test("interleaved P=4 V=2 M=8: warm-up, steady, cool-down and order of every stage", function()
    local s = schedule.build(4, 2, 8)
    T.eq(s.kind, "interleaved", "kind")
    for r = 0, 3 do
        local st = s.stages[r + 1]
        T.eq({ st.warmup, st.steady, st.cooldown },
             { DOC_WARMUP.vp2[r], DOC_STEADY.vp2[r], DOC_WARMUP.vp2[r] }, "counts of r" .. r)
        T.eq(schedule.order_string(st, 2), DOC_VP2[r] or (order_interleaved(4, 2, 8, r)),
             "order of r" .. r)
    end
end)

T.test("Megatron's example table (docs/megatron.md 3.2): P=2 N=3 M=5 V=2", function()
    local t = schedule.schedule_table(5, 2, 3)
    local mbs, chunks = {}, {}
    for i, e in ipairs(t) do mbs[i], chunks[i] = e.mb, e.chunk end
    T.eq(mbs, { 0, 1, 2, 0, 1, 2, 3, 4, 3, 4 }, "micro-batches")
    T.eq(chunks, { 0, 0, 0, 1, 1, 1, 0, 0, 1, 1 }, "chunks")
end)

T.test("no pipelining: F and B of each micro-batch in turn", function()
    local s = schedule.build(1, 1, 3)
    T.eq(s.kind, "none", "kind")
    T.eq(schedule.order_string(s.stages[1], 1), "F0 B0 F1 B1 F2 B2", "order")
end)

T.test("exchanges: Megatron's posting order and the wrap-around peer", function()
    -- 1F1B r1 of 4, first steady step: send act next + recv grad next, one batch
    local st = schedule.build(4, 1, 8).stages[2]
    local seen = {}
    for _, s in ipairs(st.steps) do
        if s.kind == "X" and #s.ops == 2 and s.ops[1].dir == "next" then
            seen[#seen + 1] = s
        end
    end
    T.ok(#seen > 0, "stage 1 has a send_forward_recv_backward")
    local x = seen[1]
    T.eq({ x.ops[1].send, x.ops[1].what, x.ops[2].send, x.ops[2].what },
         { true, "act", false, "grad" }, "ops of the first combined exchange")
    -- interleaved: stage 3's chunk 0 sends its output "next", to stage 0's chunk 1
    local last = schedule.build(4, 2, 8).stages[4]
    local wraps = 0
    for _, s in ipairs(last.steps) do
        for _, op in ipairs(s.ops or {}) do
            if op.send and op.what == "act" then
                T.eq({ op.dir, op.chunk }, { "next", 0 }, "stage 3 sends only chunk 0's output")
                wraps = wraps + 1
            end
        end
    end
    T.eq(wraps, 8, "stage 3 forwards every micro-batch of chunk 0 to stage 0")
end)

-- -- The checker against broken schedules ---------------------------------------------------------

local function copy(v)
    if type(v) ~= "table" then return v end
    local t = {}
    for k, x in pairs(v) do t[k] = copy(x) end
    return t
end

-- Names as program.lua gives them: stage r run by a concrete rank (here: 4 ranks per stage).
local function names(P)
    local n = {}
    for r = 0, P - 1 do n[r] = ("stage %d (rank %d)"):format(r, 4 * r) end
    return n
end

local function rejects(sched, opts, ...)
    local ok, why = verify.check(sched, opts)
    T.ok(not ok, "the checker accepted a broken schedule")
    local text = table.concat(why, "\n")
    for _, want in ipairs({ ... }) do
        T.ok(text:find(want, 1, true), "counterexample lacks '%s':\n%s", want, text)
    end
    return text
end

-- Index of the first step of stage 'st' satisfying pred.
local function find(st, pred)
    for i, s in ipairs(st.steps) do
        if pred(s) then return i end
    end
    error("no such step")
end

local function combined(dir_send)   -- exchange with a send to dir_send and a receive
    return function(s)
        return s.kind == "X" and #s.ops == 2 and s.ops[1].send ~= s.ops[2].send
            and (s.ops[1].send and s.ops[1] or s.ops[2]).dir == dir_send
    end
end

-- Split exchange i of stage 'st' into its send alone, then its receive alone.
local function send_first(st, i)
    local x = st.steps[i]
    local snd = x.ops[1].send and x.ops[1] or x.ops[2]
    local rcv = x.ops[1].send and x.ops[2] or x.ops[1]
    st.steps[i] = { kind = "X", ops = { snd } }
    table.insert(st.steps, i + 1, { kind = "X", ops = { rcv } })
end

T.test("the generated P=4 schedules pass (baseline of the broken cases)", function()
    for _, V in ipairs({ 1, 2 }) do
        local ok, why = verify.check(schedule.build(4, V, 8), { names = names(4) })
        T.ok(ok, "V=%d: %s", V, why and why[1] or "")
    end
end)

T.test("broken: swapped send/recv (both neighbours send first) deadlocks", function()
    local s = copy(schedule.build(4, 1, 8))
    -- stage 1 sends its activations before receiving the gradient; stage 2 sends its
    -- gradient before receiving the activations: each blocks in its send
    send_first(s.stages[2], find(s.stages[2], combined("next")))
    send_first(s.stages[3], find(s.stages[3], combined("prev")))
    rejects(s, { names = names(4) }, "deadlocks",
            "stage 1 (rank 4) waits at step", "send activations mb 2 (chunk 0) to stage 2 (rank 8)",
            "stage 2 (rank 8) waits at step", "send gradient mb 0 (chunk 0) to stage 1 (rank 4)")
end)

T.test("broken: two receives swapped on one stage", function()
    local s = copy(schedule.build(2, 1, 4))
    -- stage 1 receives micro-batch 1 where micro-batch 0 arrives
    local st = s.stages[2]
    local a = find(st, function(x) return x.kind == "X" and not x.ops[1].send end)
    local b = find(st, function(x)
        return x.kind == "X" and #x.ops == 2 and not x.ops[2].send and x.ops[2].what == "act"
    end)
    st.steps[a].ops[1].mb, st.steps[b].ops[2].mb = st.steps[b].ops[2].mb, st.steps[a].ops[1].mb
    rejects(s, { names = names(2) }, "stage 0 (rank 0): send activations mb 0",
            "stage 1 (rank 4): recv activations mb 1", "orders disagree")
end)

T.test("broken: a missing receive", function()
    local s = copy(schedule.build(4, 1, 8))
    -- stage 2 forgets to receive the gradient of its last cool-down backward
    local st = s.stages[3]
    local i
    for j = #st.steps, 1, -1 do
        local x = st.steps[j]
        if x.kind == "X" and #x.ops == 1 and not x.ops[1].send then i = j; break end
    end
    table.remove(st.steps, i)
    rejects(s, { names = names(4) }, "stage 2 (rank 8) runs the backward of mb 7 (chunk 0) " ..
            "before its output gradient arrived")
end)

T.test("broken: a missing receive in a batched exchange hangs the sender", function()
    local s = copy(schedule.build(2, 1, 4))
    -- stage 1 drops the activation receive of its first combined exchange, and (to keep its
    -- own compute consistent) nothing else: the forward finds no input
    local st = s.stages[2]
    local i = find(st, combined("prev"))
    local x = st.steps[i]
    x.ops = { x.ops[1].send and x.ops[1] or x.ops[2] }
    rejects(s, { names = names(2) }, "stage 1 (rank 4) runs the forward of mb 1 (chunk 0) " ..
            "before its input arrived")
end)

T.test("broken: a send before the compute that produces it", function()
    local s = copy(schedule.build(4, 2, 8))
    -- stage 0 sends mb 0's activations before running the forward of mb 0
    local st = s.stages[1]
    local f = find(st, function(x) return x.kind == "F" end)
    local x = find(st, function(y) return y.kind == "X" end)
    st.steps[f], st.steps[x] = st.steps[x], st.steps[f]
    rejects(s, { names = names(4) }, "stage 0 (rank 0) would send activations mb 0 (chunk 0) " ..
            "to stage 1 (rank 4) before its forward ran")
end)

T.test("broken: a shape mismatch", function()
    local s = schedule.build(2, 1, 2)
    -- stage 1 expects half the elements (e.g. a sequence-parallel shard) for activations
    local function shape(r, op) return (r == 1 and op.what == "act") and 2048 or 4096 end
    rejects(s, { names = names(2), shape = shape }, "stage 0 (rank 0): send activations mb 0",
            "stage 1 (rank 4): recv activations mb 0", "shapes 4096 and 2048 elements")
end)

T.test("broken on NCCL only: two kinds of message to one peer posted in another order", function()
    -- P=2 V=2: stage 0 sends stage 1 activations and gradients; posting the gradient alone
    -- first is fine where tags keep them apart (MPI), but NCCL matches the gradient with the
    -- receive of the activations that stage 1 posts first
    local s = copy(schedule.build(2, 2, 4))
    local st = s.stages[1]
    local i = find(st, function(x)
        if x.kind ~= "X" then return false end
        local grad, act = false, false
        for _, op in ipairs(x.ops) do
            grad = grad or (op.send and op.what == "grad")
            act = act or (op.send and op.what == "act")
        end
        return grad and act
    end)
    local x = st.steps[i]
    local g = x.ops[1]
    T.eq({ g.send, g.what }, { true, "grad" }, "the exchange starts with the gradient send")
    table.remove(x.ops, 1)
    table.insert(st.steps, i, { kind = "X", ops = { g } })
    local ok, why = verify.check(s, { names = names(2) })
    T.ok(ok, "MPI semantics reject it: %s", why and why[1] or "")
    rejects(s, { names = names(2), transport = "nccl" },
            "stage 0 (rank 0): send gradient mb 0 (chunk 1) to stage 1 (rank 4), but " ..
            "stage 1 (rank 4): recv activations mb 2 (chunk 0)")
end)

-- The collectives program.lua appends, with stage 1 entering two of them in the other order.
local function with_collectives(s, swap_group)
    local P = s.P
    local all = {}
    for r = 0, P - 1 do all[#all + 1] = r end
    for r = 0, P - 1 do
        local steps = s.stages[r + 1].steps
        steps[#steps + 1] = { kind = "C", group = "world", members = all,
                              name = "all-reduce of the gradient norm" }
        steps[#steps + 1] = { kind = "C", group = swap_group, members = all,
                              name = "all-reduce of the loss" }
    end
    local st = s.stages[2].steps
    st[#st], st[#st - 1] = st[#st - 1], st[#st]
    return s
end

T.test("broken: collectives of one group entered in different orders", function()
    local s = with_collectives(copy(schedule.build(4, 1, 4)), "world")
    rejects(s, { names = names(4) }, "stage 0 (rank 0) enters all-reduce of the gradient norm " ..
            "on group world while stage 1 (rank 4) enters all-reduce of the loss")
end)

T.test("broken: collectives of two groups entered in different orders deadlock", function()
    local s = with_collectives(copy(schedule.build(4, 1, 4)), "mp")
    rejects(s, { names = names(4) }, "deadlocks",
            "stage 0 (rank 0) waits at step", "in all-reduce of the gradient norm on group world",
            "stage 1 (rank 4) waits at step", "in all-reduce of the loss on group mp")
end)

T.test("broken: a backward dropped", function()
    local s = copy(schedule.build(1, 1, 3))
    table.remove(s.stages[1].steps)     -- the last B
    rejects(s, { names = names(1) }, "stage 0 (rank 0) never runs the backward of mb 2 (chunk 0)")
end)

-- -- Every generated schedule passes -------------------------------------------------------------

-- Replay a stage's steps with its slots and gradient buffers (schedule.assign_slots,
-- assign_dy): no slot holds two micro-batches at once (with a pool: no slot index, whichever
-- the chunk); every micro-batch's input lands in the slot its forward and backward use; the
-- gradient buffer a backward uses holds its own gradient (the last to write it: its receive,
-- or the head's forward that makes it), and the input's gradient it leaves there is still
-- there when it is sent in a later row (lib/model.c gpt_sched_op: gradients go out of and
-- come into the buffers), with no receive of the same row landing in it.
local function check_slots(st, V, slots, pooled, dys)
    local busy = {}          -- "chunk:slot" (pooled: "slot") -> "mb.chunk"
    local last = {}          -- gradient buffer -> the micro-batch that wrote it last
    local received = {}      -- micro-batches whose gradient comes in a message
    local held, peak = 0, 0
    for _, s in ipairs(st.steps) do
        for _, op in ipairs(s.kind == "X" and s.ops or {}) do
            if not op.send and op.what == "grad" then received[op.mb .. "." .. op.chunk] = true end
        end
    end
    local function where(mb, c)
        local k = mb .. "." .. c
        local idx = assert(slots.slot[k], "no slot for " .. k)
        return k, pooled and tostring(idx) or (c .. ":" .. idx)
    end
    local function buffer(k)
        return assert(dys.dy[k], "no gradient buffer for " .. k)
    end
    local function hold(mb, c)
        local k, s = where(mb, c)
        if busy[s] == k then return end
        T.ok(busy[s] == nil, "slot %s holds %s and %s", s, tostring(busy[s]), k)
        busy[s] = k
        held = held + 1
        peak = math.max(peak, held)
    end
    for _, s in ipairs(st.steps) do
        if s.kind == "X" then
            local sent = {}      -- a row's messages are posted together
            for _, op in ipairs(s.ops) do
                if op.send and op.what == "grad" then
                    local k = op.mb .. "." .. op.chunk
                    local b = buffer(k)
                    T.ok(last[b] == k, "gradient of %s sent from buffer %d, last written by %s",
                         k, b, tostring(last[b]))
                    sent[b] = k
                end
            end
            for _, op in ipairs(s.ops) do
                if not op.send and op.what == "act" then hold(op.mb, op.chunk) end
                if not op.send and op.what == "grad" then
                    local k, key = where(op.mb, op.chunk)
                    local b = buffer(k)
                    T.ok(busy[key] == k, "gradient of %s received for slot %s, held by %s", k,
                         key, tostring(busy[key]))
                    T.ok(sent[b] == nil, "gradient of %s received into buffer %d while %s's " ..
                         "goes out of it", k, b, tostring(sent[b]))
                    last[b] = k
                end
            end
        elseif s.kind == "F" then
            hold(s.mb, s.chunk)
            local k = s.mb .. "." .. s.chunk
            if not received[k] then last[buffer(k)] = k end    -- the head makes its gradient
        elseif s.kind == "B" then
            local k, key = where(s.mb, s.chunk)
            T.ok(busy[key] == k, "backward of %s finds %s in its slot", k, tostring(busy[key]))
            local b = buffer(k)
            T.ok(last[b] == k, "backward of %s finds buffer %d last written by %s", k, b,
                 tostring(last[b]))
            busy[key] = nil
            held = held - 1
        end
    end
    T.eq(held, 0, "micro-batches left in flight")
    T.eq(peak, slots.inflight, "peak in flight")
    for c = 0, V - 1 do
        if pooled then
            T.eq(slots.nslots[c], slots.inflight, "pool: chunk %d's slots are the stage's peak", c)
        else
            T.ok(slots.nslots[c] <= slots.inflight, "chunk %d has more slots than in flight", c)
        end
    end
    T.ok(dys.n <= (V > 1 and 2 or 1), "%d gradient buffers", dys.n)
end

T.test("hundreds of random valid sizes: generated schedules verify", function()
    local rnd = T.random(6)
    local n = 0
    for _ = 1, 300 do
        local P = rnd(1, 16)
        local V = P > 1 and rnd(1, 4) or 1
        local Mb
        if V > 1 then Mb = P * rnd(1, 64 // P) else Mb = rnd(1, 64) end
        local s = schedule.build(P, V, Mb)
        for _, transport in ipairs({ "mpi", "nccl" }) do
            local ok, why = verify.check(s, { transport = transport })
            T.ok(ok, "%s, P=%d V=%d M=%d: %s", transport, P, V, Mb,
                 why and table.concat(why, " | ") or "")
        end
        for r = 0, P - 1 do
            local st = s.stages[r + 1]
            local want, w
            if P == 1 then want, w = nil, 0
            elseif V == 1 then want, w = order_1f1b(P, Mb, r)
            else want, w = order_interleaved(P, V, Mb, r) end
            if want then
                T.eq(schedule.order_string(st, V), want,
                     ("order of P=%d V=%d M=%d r%d"):format(P, V, Mb, r))
            end
            T.eq(st.warmup, w, ("warm-up of P=%d V=%d M=%d r%d"):format(P, V, Mb, r))
            local slots, dys = schedule.assign_slots(st, V), schedule.assign_dy(st)
            check_slots(st, V, slots, false, dys)
            check_slots(st, V, schedule.assign_slots(st, V, true), true, dys)
            if V == 1 then
                T.eq(slots.inflight, math.min(w + 1, Mb),
                     ("in flight on P=%d M=%d r%d (3.3: warm-up + 1)"):format(P, Mb, r))
            end
        end
        n = n + 1
    end
    T.eq(n, 300, "configurations checked")
end)

T.test("large corners verify: P=16 V=4 M=64, P=16 M=1, P=2 V=4 M=2", function()
    for _, c in ipairs({ { 16, 4, 64 }, { 16, 1, 1 }, { 2, 4, 2 }, { 16, 1, 64 }, { 3, 3, 3 } }) do
        local ok, why = verify.check(schedule.build(c[1], c[2], c[3]))
        T.ok(ok, "P=%d V=%d M=%d: %s", c[1], c[2], c[3], why and why[1] or "")
    end
end)

-- -- What users see: make inspect RANK=r, schedule.svg, the stage sources -------------------------

local driver = require("driver")
local emit = require("emit")
local F = require("fixtures")
local inspect = require("inspect")
local program = require("program")
local svg = require("svg")

-- The sends and receives inspect --rank lists for every rank: per (src, dst, what) the
-- micro-batches in order, as the sender and as the receiver print them.
local function listed_messages(opts)
    local r = driver.passes(opts, 6)
    local cfg = r.config
    local sent, got = {}, {}
    for rank = 0, cfg.world - 1 do
        local text = inspect.rank(cfg, r.topology, r.partition, r.shards, r.schedule, r.program,
                                  rank)
        for line in text:gmatch("[^\n]+") do
            local dir, what, mb, peer = line:match("(%a+) (%a+) mb (%d+)[%w ]* (%a+ rank %d+)$")
            if dir == "send" or dir == "recv" then
                local p = tonumber(peer:match("%d+"))
                local key = dir == "send" and (rank .. ">" .. p .. ":" .. what)
                    or (p .. ">" .. rank .. ":" .. what)
                local t = dir == "send" and sent or got
                t[key] = (t[key] or "") .. mb .. " "
            end
        end
    end
    return sent, got
end

T.test("inspect --rank: each listed send meets the peer's listed receive, in order", function()
    for _, opts in ipairs({ { model = "tiny", tp = 2, pp = 4, nmb = 8 },
                            { model = "tiny", pp = 4, vp = 2, dp = 2, nmb = 4 },
                            { model = "tiny", tp = 2, pp = 2, dp = 2, vp = 2, nmb = 6 } }) do
        local sent, got = listed_messages(opts)
        local n = 0
        for k, mbs in pairs(sent) do
            T.eq(got[k], mbs, "micro-batches on " .. k)
            n = n + 1
        end
        for k in pairs(got) do T.ok(sent[k], "receive on %s without a send", k) end
        T.ok(n > 0, "no messages listed")
    end
end)

T.test("inspect: bubble, in-flight micro-batches and activation bytes (1F1B P=4 M=8)", function()
    local r = driver.passes({ model = "tiny", pp = 4, nmb = 8, mbs = 1 }, 6)
    local pl = inspect.pipeline(r.config, r.schedule, r.program)
    T.eq(pl.bubble, 3 / 8, "bubble (P-1)/M")
    local inflight = {}
    for k = 0, 3 do inflight[k + 1] = pl.stages[k].inflight end
    T.eq(inflight, { 4, 3, 2, 1 }, "in flight = warm-up + 1 (3.3)")
    -- tiny, T=64, B=1, C=64, 4 heads, FF 256: per layer ln_1, attention output, x +
    -- attention, ln_2, output 5*64*64; 2 means and rstds 4*64; q|k|v 64*192; log-sum-exp
    -- 4*64; c_fc, GELU 2*64*256 floats; x 64*64; 2 layers a stage; tokens on stage 0; and
    -- one gradient buffer dy of 64*64 a stage (1F1B: a gradient arrives just before its
    -- backward, and its input's leaves in the next row)
    local layer = 5 * 4096 + 256 + 12288 + 256 + 32768
    local slot = 4 * (4096 + 2 * layer)
    T.eq(pl.stages[1].bytes, { slot }, "bytes per slot, stage 1")
    T.eq(pl.stages[0].bytes, { slot + 4 * 64 }, "bytes per slot, stage 0 (token ids)")
    for k = 0, 3 do T.eq(pl.stages[k].grads, 1, "gradient buffers, stage " .. k) end
    T.eq(pl.stages[0].peak, 4 * (slot + 256) + 4 * 4096, "peak on stage 0: 4 slots, 1 dy")
    local text = inspect.summary(r.config, r.topology, r.partition, r.shards, r.schedule,
                                 r.program)
    T.ok(text:find("bubble     (P-1)/M = 3/8 = 0.375", 1, true), "summary lacks the bubble")
end)

T.test("schedule.svg: one row per stage, F and B boxes, simulated bubble = formula", function()
    local rnd = T.random(9)
    for _ = 1, 60 do
        local P = rnd(1, 8)
        local V = P > 1 and rnd(1, 3) or 1
        local Mb = V > 1 and P * rnd(1, 4) or rnd(1, 24)
        local s = schedule.build(P, V, Mb)
        local tl = svg.timeline(s)
        T.eq(svg.bubble(tl), (P - 1) / (V * Mb), ("bubble of P=%d V=%d M=%d"):format(P, V, Mb))
        local text = svg.render(s)
        for r = 0, P - 1 do
            local f, b = 0, 0
            for kind in text:gmatch("<title>stage " .. r .. ": (%a+)ward") do
                if kind == "for" then f = f + 1 else b = b + 1 end
            end
            T.eq({ f, b }, { Mb * V, Mb * V }, ("boxes of stage %d, P=%d V=%d M=%d"):format(
                r, P, V, Mb))
        end
        T.eq(svg.render(s), text, "rendering twice gives the same text")
    end
end)

-- Stage sources without their banner (the first comment).
local function stage_bodies(fields, opts)
    local cfg, topo, part, sh = F.build(fields, opts)
    local sched = schedule.build(cfg.pp, cfg.vp, cfg.nmb)
    local prog = program.build(cfg, topo, part, sh, sched)
    local out, shared = {}, {}
    for _, f in ipairs(emit.render(cfg, topo, part, sh, sched, prog)) do
        if f.name:match("^stage%d+%.c$") then
            out[#out + 1] = { name = f.name, body = f.text:gsub("^/%*.-%*/\n", "", 1) }
        elseif f.name:match("%.c$") or f.name:match("%.cu$") then
            shared[#shared + 1] = f.name
        end
    end
    return out, shared
end

T.test("stage sources: one per stage, never two alike; the rest shared by all stages", function()
    -- including layouts whose stages share a schedule (M < P-1; interleaved stages that are
    -- all warm-up): the layers each holds still differ
    for _, c in ipairs({ { { layers = 8 }, { pp = 4, nmb = 1 } },
                         { { layers = 16 }, { pp = 8, nmb = 2 } },
                         { { layers = 16 }, { pp = 8, vp = 2, nmb = 8 } },
                         { { layers = 8 }, { pp = 4, tp = 2, dp = 2, vp = 2, nmb = 4 } } }) do
        local bodies, shared = stage_bodies(c[1], c[2])
        T.eq(#bodies, c[2].pp, "stage sources")
        T.eq(shared, { "program.c" }, "the one other source (the library has the rest)")
        for i = 1, #bodies do
            for j = i + 1, #bodies do
                T.ok(bodies[i].body ~= bodies[j].body, "%s and %s are identical: emit one",
                     bodies[i].name, bodies[j].name)
            end
        end
    end
end)

T.done()
