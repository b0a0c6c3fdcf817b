-- verify.lua: prove a program's communication cannot hang before any code is emitted.
--
-- A pure pass. verify.check(sched, opts) simulates every stage's straight-line program: the
-- schedule's forward (F), backward (B) and exchange (X) steps with every collective (C) the
-- stage performs, in order -- program.events builds that list from the program record: the
-- collectives inside each library call and those of the step's tail, so a collective the
-- program runs cannot escape the check. The transport's blocking semantics: an exchange posts
-- all its sends and receives together and completes when every one of them has met its
-- partner; a lone send waits for its receive (no eager buffering is assumed); an asynchronous
-- exchange (async: activations sent only) lets the stage go on at once and must complete
-- before its next exchange is posted (or before it finishes); a collective completes once
-- every member stage entered it. A started collective (overlap.lua) counts where it starts: a
-- start never waits, so waiting for it later only lets a rank go further. Messages match in posting order per (source,
-- destination, tag) as MPI matches them (activations and gradients travel under different
-- tags), or, for NCCL, which has no tags, per (source, destination) with each exchange posted
-- sorted by (peer, tag) as the runtime posts it; program.lua checks both.
-- It checks that every send meets a receive of the same kind, shape, micro-batch and chunk, that
-- a tensor is sent only after the forward (backward) that computes it, that a forward
-- (backward) only runs after its input (output gradient) arrived, that every collective is
-- entered by all its members in the same order, that all stages finish, and that every stage
-- ran the forward and the backward of each (micro-batch, chunk) exactly once.
-- On failure it returns nil and a counterexample (lines of text); it never raises.

local schedule = require("schedule")

local M = {}

local vstage, peer_of = schedule.virtual_stage, schedule.peer

-- The chunk on the peer that an op's tensor belongs to, or nil if there is none.
local function peer_chunk(P, V, r, op)
    local v = vstage(P, r, op.chunk)
    local pv
    if op.what == "act" then
        pv = op.send and v + 1 or v - 1
    else
        pv = op.send and v - 1 or v + 1
    end
    if pv < 0 or pv >= P * V then return nil end
    return pv // P
end

local function describe(op, P, names, r)
    local peer = peer_of(P, r, op.dir)
    local noun = op.what == "act" and "activations" or "gradient"
    return ("%s %s mb %d (chunk %d) %s %s"):format(
        op.send and "send" or "recv", noun, op.mb, op.chunk,
        op.send and "to" or "from", names[peer])
end

-- Message tags as the program uses them (stage.c.tmpl TAG_ACT, TAG_GRAD).
local TAG = { act = 0, grad = 1 }

-- The ops of an exchange in the order the transport posts them: as listed (MPI matches per
-- tag), or sorted by (peer, tag), stably, as the runtime posts them to NCCL, which has no tags
-- and matches every message between two ranks in posting order (runtime/rt.h rt_p2p).
local function posting_order(ops, P, r, transport)
    if transport ~= "nccl" then return ops end
    local idx = {}
    for i = 1, #ops do idx[i] = i end
    table.sort(idx, function(a, b)
        local pa, pb = peer_of(P, r, ops[a].dir), peer_of(P, r, ops[b].dir)
        if pa ~= pb then return pa < pb end
        local ta, tb = TAG[ops[a].what], TAG[ops[b].what]
        if ta ~= tb then return ta < tb end
        return a < b
    end)
    local out = {}
    for i, j in ipairs(idx) do out[i] = ops[j] end
    return out
end

--[[
** Simulate sched.stages[1..P] (stage r at [r+1], each {steps=...}: F, B, X and C steps, ir.lua
** Step records). opts.names[r] names stage r's ranks for
** messages (default "stage r"); opts.shape(r, op) gives the element count of an op (default
** the same for all); opts.transport is "mpi" (default: messages match per sender, receiver
** and tag) or "nccl" (per sender and receiver only, each exchange posted sorted by peer and
** tag); opts.forward_only: a forward-only schedule (an evaluation's), whose micro-batches
** need no backward. Returns true, or nil plus an array of lines explaining the failure.
]]
function M.check(sched, opts)
    opts = opts or {}
    local P, V = sched.P, sched.V
    local names = opts.names or {}
    for r = 0, P - 1 do names[r] = names[r] or ("stage " .. r) end
    local shape = opts.shape or function() return 1 end
    local transport = opts.transport or "mpi"

    local pc, pending, sending = {}, {}, {}
    local have_act, have_grad, fwd_done, bwd_done = {}, {}, {}, {}
    for r = 0, P - 1 do
        pc[r], have_act[r], have_grad[r], fwd_done[r], bwd_done[r] = 1, {}, {}, {}, {}
    end
    local queues = {}      -- channel key -> {sends = {}, recvs = {}}
    local coll = {}        -- group -> {entered = {[r] = n}, names = {["r#n"] = name}}
    local arrived = {}     -- [r] = true while r sits in a collective it has entered
    local errors = {}

    local function channel(src, dst, what)
        local key = src .. ">" .. dst .. ":" .. (transport == "nccl" and "all" or what)
        local q = queues[key]
        if not q then q = { sends = {}, recvs = {}, src = src, dst = dst }; queues[key] = q end
        return q
    end

    local function key(mb, c) return mb .. "." .. c end

    -- Try to match the heads of a channel; records a mismatch as an error.
    local function match(q)
        while #q.sends > 0 and #q.recvs > 0 do
            local s, rv = table.remove(q.sends, 1), table.remove(q.recvs, 1)
            local want = peer_chunk(P, V, q.src, s.op)
            local ss, rs = shape(q.src, s.op), shape(q.dst, rv.op)
            if want ~= rv.op.chunk or s.op.mb ~= rv.op.mb or s.op.what ~= rv.op.what
               or ss ~= rs then
                errors[#errors + 1] = ("%s: %s, but %s: %s%s"):format(
                    names[q.src], describe(s.op, P, names, q.src),
                    names[q.dst], describe(rv.op, P, names, q.dst),
                    ss ~= rs and (" (shapes %d and %d elements)"):format(ss, rs)
                        or " (send and receive orders disagree)")
                return false
            end
            s.done, rv.done = true, true
            if rv.op.what == "act" then
                have_act[q.dst][key(rv.op.mb, rv.op.chunk)] = true
            else
                have_grad[q.dst][key(rv.op.mb, rv.op.chunk)] = true
            end
        end
        return true
    end

    -- Run stage r as far as it can go. Returns true if it advanced.
    local function advance(r)
        local steps = sched.stages[r + 1].steps
        local moved = false
        -- an asynchronous exchange (X with async: sends only) completes before the next
        -- exchange is posted, or before the stage finishes
        local function sent()
            for _, item in ipairs(sending[r] or {}) do
                if not item.done then return false end
            end
            sending[r] = nil
            return true
        end
        while pc[r] <= #steps + 1 do
            local st = steps[pc[r]] or { kind = "END" }
            if st.kind == "END" then
                if not sent() then return moved end
            elseif st.kind == "X" then
                if not pending[r] and not sent() then return moved end
                if not pending[r] then
                    local posted = {}
                    for _, op in ipairs(posting_order(st.ops, P, r, transport)) do
                        if st.async and not op.send then
                            errors[#errors + 1] = ("%s would %s in an exchange it does not " ..
                                "wait for before computing (only sends go on during a " ..
                                "computation)"):format(names[r], describe(op, P, names, r))
                            return false
                        end
                        local made = op.what == "act" and fwd_done or bwd_done
                        if op.send and not made[r][key(op.mb, op.chunk)] then
                            errors[#errors + 1] = ("%s would %s before its %s ran"):format(
                                names[r], describe(op, P, names, r),
                                op.what == "act" and "forward" or "backward")
                            return false
                        end
                        local peer = peer_of(P, r, op.dir)
                        local item = { op = op, done = false }
                        posted[#posted + 1] = item
                        local q = op.send and channel(r, peer, op.what)
                            or channel(peer, r, op.what)
                        if op.send then q.sends[#q.sends + 1] = item
                        else q.recvs[#q.recvs + 1] = item end
                        if not match(q) then return false end
                    end
                    pending[r] = posted
                end
                if st.async then
                    sending[r] = pending[r]
                else
                    for _, item in ipairs(pending[r]) do
                        if not item.done then return moved end
                    end
                end
                pending[r] = nil
            elseif st.kind == "C" then
                -- the n-th collective on a group completes once every member entered its n-th
                local g = coll[st.group]
                if not g then g = { entered = {}, names = {} }; coll[st.group] = g end
                if not arrived[r] then
                    arrived[r] = true
                    local n = (g.entered[r] or 0) + 1
                    g.entered[r] = n
                    g.names[r .. "#" .. n] = st.name
                end
                local n = g.entered[r]
                for _, m in ipairs(st.members) do
                    if (g.entered[m] or 0) < n then return moved end
                    local other = g.names[m .. "#" .. n]
                    if other ~= st.name then
                        errors[#errors + 1] = ("%s enters %s on group %s while %s enters %s")
                            :format(names[r], st.name, st.group, names[m], other)
                        return false
                    end
                end
                arrived[r] = nil
            elseif st.kind == "F" then
                local needs = not (r == 0 and st.chunk == 0)
                if needs and not have_act[r][key(st.mb, st.chunk)] then
                    errors[#errors + 1] = ("%s runs the forward of mb %d (chunk %d) before its "
                        .. "input arrived"):format(names[r], st.mb, st.chunk)
                    return false
                end
                if fwd_done[r][key(st.mb, st.chunk)] then
                    errors[#errors + 1] = ("%s runs the forward of mb %d (chunk %d) twice")
                        :format(names[r], st.mb, st.chunk)
                    return false
                end
                fwd_done[r][key(st.mb, st.chunk)] = true
            elseif st.kind == "B" then
                if bwd_done[r][key(st.mb, st.chunk)] then
                    errors[#errors + 1] = ("%s runs the backward of mb %d (chunk %d) twice")
                        :format(names[r], st.mb, st.chunk)
                    return false
                end
                if not fwd_done[r][key(st.mb, st.chunk)] then
                    errors[#errors + 1] = ("%s runs the backward of mb %d (chunk %d) before "
                        .. "its forward"):format(names[r], st.mb, st.chunk)
                    return false
                end
                local needs = not (r == P - 1 and st.chunk == V - 1)
                if needs and not have_grad[r][key(st.mb, st.chunk)] then
                    errors[#errors + 1] = ("%s runs the backward of mb %d (chunk %d) before its "
                        .. "output gradient arrived"):format(names[r], st.mb, st.chunk)
                    return false
                end
                bwd_done[r][key(st.mb, st.chunk)] = true
            end
            pc[r] = pc[r] + 1
            moved = true
        end
        return moved
    end

    local progress = true
    while progress and #errors == 0 do
        progress = false
        for r = 0, P - 1 do
            if advance(r) then progress = true end
            if #errors > 0 then break end
        end
    end
    if #errors > 0 then return nil, errors end

    local stuck = {}
    for r = 0, P - 1 do
        local steps = sched.stages[r + 1].steps
        if pc[r] <= #steps + 1 then
            local st = steps[pc[r]] or { kind = "X" }
            if st.kind == "X" then
                local waits = {}
                for _, item in ipairs(pending[r] or sending[r] or {}) do
                    if not item.done then waits[#waits + 1] = describe(item.op, P, names, r) end
                end
                stuck[#stuck + 1] = ("%s waits at step %d to %s"):format(
                    names[r], pc[r], table.concat(waits, " and "))
            elseif st.kind == "C" then
                stuck[#stuck + 1] = ("%s waits at step %d in %s on group %s"):format(
                    names[r], pc[r], st.name, st.group)
            end
        end
    end
    if #stuck > 0 then
        table.insert(stuck, 1, "the schedule deadlocks:")
        return nil, stuck
    end
    local keys = {}
    for k in pairs(queues) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do
        local q = queues[k]
        if #q.sends > 0 or #q.recvs > 0 then
            return nil, { ("%s -> %s: %d send(s) and %d receive(s) never matched"):format(
                names[q.src], names[q.dst], #q.sends, #q.recvs) }
        end
    end
    -- every (micro-batch, chunk) went forward and backward on every stage
    for r = 0, P - 1 do
        for c = 0, V - 1 do
            for mb = 0, (sched.M or 0) - 1 do
                local k = key(mb, c)
                if not (fwd_done[r][k] and (bwd_done[r][k] or opts.forward_only)) then
                    return nil, { ("%s never runs the %s of mb %d (chunk %d)"):format(
                        names[r], fwd_done[r][k] and "backward" or "forward", mb, c) }
                end
            end
        end
    end
    return true
end

--[[
** Hops that every cp rank runs alike (ops with a relative peer: delta = +1 the next cp rank,
** -1 the previous one) complete together, hop after hop, when each hop's sends meet its own
** receives one rank over: for each (peer offset d, tag) the element counts of the sends, in
** posting order, equal those of the receives from offset -d (mod CP) with that tag (NCCL:
** per offset, the ops sorted by tag as the runtime posts them, tags not compared). Then rank
** r's hop k receives exactly what ranks r - d send in their hop k, and nothing else is in
** flight. Memoised per distinct hop. Returns true or false (no counterexample: check_ring
** simulates the ranks for one).
]]
function M.ring_hops_pair(hops, CP, nccl)
    local seen = {}
    for _, h in ipairs(hops) do
        local parts = {}
        for _, op in ipairs(h.ops) do
            parts[#parts + 1] = string.format("%s%d:%d:%d", op.send and "s" or "r", op.delta,
                                              op.tag, op.n)
        end
        local key = table.concat(parts, ",")
        if not seen[key] then
            local seq = {}          -- [dir .. offset (.. tag)] = list of counts (and tags)
            local order = {}
            for i, op in ipairs(h.ops) do order[i] = { op = op, i = i } end
            if nccl then
                table.sort(order, function(x, y)
                    if x.op.tag ~= y.op.tag then return x.op.tag < y.op.tag end
                    return x.i < y.i
                end)
            end
            for _, o in ipairs(order) do
                local op = o.op
                local off = (op.send and op.delta or -op.delta) % CP
                local k = (op.send and "s" or "r") .. off .. (nccl and "" or (":" .. op.tag))
                seq[k] = seq[k] or {}
                seq[k][#seq[k] + 1] = op.n
            end
            for k, list in pairs(seq) do
                local other = seq[(k:sub(1, 1) == "s" and "r" or "s") .. k:sub(2)] or {}
                if #other ~= #list then return false end
                for i = 1, #list do
                    if other[i] ~= list[i] then return false end
                end
            end
            seen[key] = true
        end
    end
    return true
end

--[[
** The context-parallel ring of one pipeline stage (docs/megatron.md §12), at the level of its
** CP ranks: ring.CP ranks, ring.ranks[r + 1] = cp rank r's hops in program order, each
** { what = text, ops = { { send = bool, peer = cp rank, tag = int, n = elements }, ... } };
** or ring.same = the hops every rank runs, with ops { send, delta = +1 / -1, tag, n }.
** A hop posts every op together and completes when each has met its partner (rt_p2p); the
** next hop is posted after that. Messages match per (sender, receiver, tag) in posting order
** (MPI), or per (sender, receiver) with each hop's ops sorted by (peer, tag) (NCCL:
** opts.transport = "nccl"); a matched pair must agree on the tag and the element count. The
** stage-level check (M.check) sees each hop as one collective of the stage's cp group; this
** one proves the ring's messages themselves match. Returns true, or nil and lines of text.
]]
function M.check_ring(ring, opts)
    opts = opts or {}
    if ring.same then
        -- every cp rank runs the same hops (the generator's case): the ring is sound when each
        -- hop pairs up with itself one rank over; otherwise simulate it for a counterexample
        if M.ring_hops_pair(ring.same, ring.CP, opts.transport == "nccl") then return true end
        local ranks = {}
        for r = 0, ring.CP - 1 do
            local list = {}
            for i, h in ipairs(ring.same) do
                local ops = {}
                for j, op in ipairs(h.ops) do
                    ops[j] = { send = op.send, peer = (r + op.delta) % ring.CP, tag = op.tag,
                               n = op.n }
                end
                list[i] = { what = h.what, ops = ops }
            end
            ranks[r + 1] = list
        end
        ring = { CP = ring.CP, ranks = ranks }
    end
    local CP, nccl = ring.CP, opts.transport == "nccl"
    local where = opts.where or "the cp ring"
    local pc, posted, queues, errors = {}, {}, {}, {}
    for r = 0, CP - 1 do pc[r] = 1 end

    local function op_text(r, op)
        return ("%s %d elements (tag %d) %s cp rank %d"):format(op.send and "send" or "receive",
            op.n, op.tag, op.send and "to" or "from", op.peer)
    end
    local function channel(src, dst, tag)
        local key = src .. ">" .. dst .. ":" .. (nccl and "all" or tag)
        local q = queues[key]
        if not q then
            q = { sends = {}, recvs = {}, hs = 1, hr = 1, src = src, dst = dst }
            queues[key] = q
        end
        return q
    end
    local function match(q)        -- the heads of a channel meet, in posting order
        while q.hs <= #q.sends and q.hr <= #q.recvs do
            local s, rv = q.sends[q.hs], q.recvs[q.hr]
            q.hs, q.hr = q.hs + 1, q.hr + 1
            if s.op.tag ~= rv.op.tag or s.op.n ~= rv.op.n then
                errors[#errors + 1] = ("%s: cp rank %d (%s) would %s, but cp rank %d (%s) " ..
                    "would %s"):format(where, q.src, s.what, op_text(q.src, s.op), q.dst,
                    rv.what, op_text(q.dst, rv.op))
                return false
            end
            s.done, rv.done = true, true
        end
        return true
    end
    local function sorted(ops)
        if not nccl then return ops end
        local idx = {}
        for i = 1, #ops do idx[i] = i end
        table.sort(idx, function(a, b)
            if ops[a].peer ~= ops[b].peer then return ops[a].peer < ops[b].peer end
            if ops[a].tag ~= ops[b].tag then return ops[a].tag < ops[b].tag end
            return a < b
        end)
        local out = {}
        for i, j in ipairs(idx) do out[i] = ops[j] end
        return out
    end

    local function advance(r)
        local hops, moved = ring.ranks[r + 1], false
        while pc[r] <= #hops do
            local hop = hops[pc[r]]
            if not posted[r] then
                posted[r] = {}
                for _, op in ipairs(sorted(hop.ops)) do
                    if op.peer < 0 or op.peer >= CP or op.peer == r then
                        errors[#errors + 1] = ("%s: cp rank %d (%s) would %s, not another " ..
                            "rank of the ring"):format(where, r, hop.what, op_text(r, op))
                        return false
                    end
                    local item = { op = op, done = false, what = hop.what }
                    posted[r][#posted[r] + 1] = item
                    local q = op.send and channel(r, op.peer, op.tag) or channel(op.peer, r, op.tag)
                    local list = op.send and q.sends or q.recvs
                    list[#list + 1] = item
                    if not match(q) then return false end
                end
            end
            for _, item in ipairs(posted[r]) do
                if not item.done then return moved end
            end
            posted[r] = nil
            pc[r] = pc[r] + 1
            moved = true
        end
        return moved
    end

    local progress = true
    while progress and #errors == 0 do
        progress = false
        for r = 0, CP - 1 do
            if advance(r) then progress = true end
            if #errors > 0 then break end
        end
    end
    if #errors > 0 then return nil, errors end
    local stuck = {}
    for r = 0, CP - 1 do
        local hops = ring.ranks[r + 1]
        if pc[r] <= #hops then
            local waits = {}
            for _, item in ipairs(posted[r] or {}) do
                if not item.done then waits[#waits + 1] = op_text(r, item.op) end
            end
            stuck[#stuck + 1] = ("cp rank %d waits at hop %d (%s) to %s"):format(r, pc[r],
                hops[pc[r]].what, table.concat(waits, " and "))
        end
    end
    if #stuck > 0 then
        table.insert(stuck, 1, where .. " deadlocks:")
        return nil, stuck
    end
    local keys = {}
    for k in pairs(queues) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do
        local q = queues[k]
        local ns, nr = #q.sends - q.hs + 1, #q.recvs - q.hr + 1
        if ns > 0 or nr > 0 then
            return nil, { ("%s: cp rank %d -> %d: %d send(s) and %d receive(s) never matched")
                :format(where, q.src, q.dst, ns, nr) }
        end
    end
    return true
end

-- -- Communication in flight ------------------------------------------------------------------

local function meets(ranges, r)
    for _, x in ipairs(ranges or {}) do
        if x.all or r.all or (x.buf == r.buf and x.lo < r.hi and r.lo < x.hi) then return x end
    end
end

local function range_text(x, what)
    if x.all then return "every " .. what:sub(1, -2) end
    return string.format("%s [%d, %d) of buffer %d", what, x.lo, x.hi, x.buf)
end

--[[
** check_async(events, where): the asynchronous communication of one stage's code (events from
** overlap.events: two steps of calls, starts and waits, in the order they run) is safe:
**   * a request is started only when it is not in flight, and waited only when it is -- but
**     for a parameter all-gather's wait in the first step, before any was started (rt_wait of
**     NULL: the initial parameters are whole);
**   * while a gradient reduction is in flight nothing reads or writes the gradients it covers,
**     and while a parameter all-gather is in flight nothing reads or writes its parameters;
**   * every reduction is waited in the step that starts it; every request is started in each
**     step.
** Returns true, or nil and the lines of a counterexample. With these, the overlapped program
** computes what its blocking form (each start followed by its wait) computes; that it cannot
** hang follows from the blocking form's check (M.check), which sees each collective where it
** starts: a start never waits for another rank, so waiting later only lets a rank go further.
]]
function M.check_async(events, where)
    local inflight, started = {}, {}
    local function fail(...)
        return nil, { where .. ": " .. string.format(...) }
    end
    for _, e in ipairs(events) do
        if e.start then
            local a = e.start
            if inflight[a.req] then
                return fail("req[%d] (%s %s) is started at %s while still in flight since %s",
                            a.req, a.kind, a.what, e.where, inflight[a.req].where)
            end
            inflight[a.req] = { op = a, where = e.where }
            started[a.req] = true
        elseif e.wait then
            if not inflight[e.wait] then
                if not (e.param_wait and e.where:match("^step 1,")) then
                    return fail("req[%d] is waited at %s but not in flight", e.wait, e.where)
                end
            end
            inflight[e.wait] = nil
        elseif e.step_end then
            for req, f in pairs(inflight) do
                if f.op.kind == "reduce" then
                    return fail("req[%d] (the reduction of %s), started at %s, is not waited " ..
                                "by the end of its step", req, f.op.what, f.where)
                end
            end
            for _, list in ipairs({ "reduce", "gather" }) do
                for _, a in ipairs(events.plan and events.plan[list] or {}) do
                    if not started[a.req] then
                        return fail("req[%d] (%s of %s) is never started in step %d", a.req,
                                    a.kind, a.what, e.step_end)
                    end
                end
            end
            started = {}
        else
            for req, f in pairs(inflight) do
                local a = f.op
                local r = { buf = a.buf, lo = a.lo, hi = a.hi }
                local ranges, mode, what
                if a.kind == "reduce" then ranges, mode, what = e.grads, e.gmode, "gradients"
                else ranges, mode, what = e.params, e.pmode, "parameters" end
                local x = meets(ranges, r)
                if x then
                    return fail("req[%d] (the %s of %s), started at %s, is in flight when %s " ..
                                "%s %s", req, a.kind == "reduce" and "reduction" or
                                "all-gather of the parameters", a.what, f.where, e.where,
                                mode == "w" and "writes" or "reads", range_text(x, what))
                end
            end
        end
    end
    return true
end

return M
