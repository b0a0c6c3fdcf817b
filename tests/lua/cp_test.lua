-- tests/lua/cp_test.lua: context parallelism in the passes (docs/megatron.md §12):
--   * the sizes a cp rank trains with (its share of the sequence, the load-balanced chunks);
--   * the memory plan holds the ring's buffers (and nothing of them without CP);
--   * the communication of a layer: CP-1 hops of K|V forward, CP-1 hops of K|V with dK|dV and
--     one of dK|dV alone backward, counted by hand;
--   * the ring verifier accepts the program's ring on MPI and NCCL matching and refuses broken
--     rings (a rank that skips a hop, a receive from the wrong neighbour, counts that disagree)
--     with a counterexample naming the cp ranks.
-- Run: build/gen --lua tests/lua/cp_test.lua (tests/lua/suite.sh).

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
require("strict")
local F = require("fixtures")
local T = require("harness")("cp")
local program = require("program")
local verify = require("verify")

local function mem(sp, id)
    for _, m in ipairs(sp.mem) do
        if m.id == id then return m end
    end
    error("no mem " .. id)
end

-- the fixture model: hidden 64, heads 4, seq_len 64 (tests/lua/fixtures.lua)
T.test("sizes: a cp rank's share of the sequence, in two chunks", function()
    local cfg = F.config({}, { cp = 4, tp = 2 })
    local s = program.sizes(cfg)
    T.eq({ s.seq, s.T, s.t_chunk, s.N }, { 64, 16, 8, 16 }, "SEQ 64 over CP 4: 16 positions")
    local one = program.sizes(F.config({}, {}))
    T.eq({ one.T, one.t_chunk }, { 64, 64 }, "CP 1: one chunk, the whole sequence")
end)

T.test("the memory plan holds the ring's buffers", function()
    local _, _, _, _, _, p = F.build({ layers = 2 }, { cp = 2, tp = 2, mbs = 3 })
    local sp, N, cl = p.stages[1], 3 * 32, 32
    T.eq(mem(sp, "S_RING_KV").elems, 2 * N * 2 * cl, "two K|V blocks of (N, 2 C_LOCAL)")
    T.eq(mem(sp, "S_RING_KV").instance, 4 * 2 * N * 2 * cl, "f32")
    T.eq(mem(sp, "S_RING_DKV").elems, 2 * N * 2 * cl, "two f32 dK|dV blocks")
    T.eq(mem(sp, "S_RING_ACC").elems, N * cl, "one f32 output / dq")
    T.eq(mem(sp, "L_LSE").elems, 3 * 2 * 32, "lse (B, HEADS_LOCAL, SEQ/CP)")
    local _, _, _, _, _, b = F.build({ layers = 2 }, { cp = 2, bf16 = true })
    T.eq(mem(b.stages[1], "S_RING_KV").instance, 2 * 2 * 32 * 2 * 64, "bf16 K|V: 2 bytes")
    T.eq(mem(b.stages[1], "S_RING_DKV").instance, 4 * 2 * 32 * 2 * 64, "dK|dV stays f32")
    local _, _, _, _, _, one = F.build({ layers = 2 }, {})
    for _, id in ipairs({ "S_RING_KV", "S_RING_DKV", "S_RING_ACC" }) do
        T.eq(mem(one.stages[1], id).how, "NONE", id .. ": none without CP")
    end
end)

-- The ring hops of the first forward and the first backward of stage 0.
local function hops(prog)
    local out = {}
    for _, o in ipairs(prog.stages[1].schedule) do
        if (o.kind == "F" or o.kind == "B") and not out[o.kind] then
            local list = {}
            for _, c in ipairs(o.comm) do
                if c.op == "ring" then list[#list + 1] = { c.n, c.n2 or 0, c.dtype } end
            end
            out[o.kind] = list
        end
    end
    return out
end

T.test("a layer's ring traffic, by hand", function()
    local _, _, _, _, _, p = F.build({ layers = 2 }, { cp = 4 })
    local kv = 16 * 2 * 64               -- N = SEQ/CP * B = 16 rows of K|V (2 C)
    local h = hops(p)
    local fwd, bwd = {}, {}
    for l = 1, 2 do
        for _ = 1, 3 do fwd[#fwd + 1] = { kv, 0, "f32" } end
        for _ = 1, 3 do
            bwd[#bwd + 1] = { kv, 0, "f32" }
            bwd[#bwd + 1] = { 0, kv, "f32" }
        end
        bwd[#bwd + 1] = { 0, kv, "f32" }
    end
    T.eq(h.F, fwd, "forward: CP-1 hops of K|V per layer")
    T.eq(h.B, bwd, "backward: CP-1 hops of K|V, each followed by dK|dV; then dK|dV home")
    local _, _, _, _, _, rc = F.build({ layers = 2 }, { cp = 2, recompute = "selective" })
    local n = 0
    for _ in ipairs(hops(rc).B) do n = n + 1 end
    T.eq(n, 2 * (1 + 3), "selective core_attn: the forward ring again in the backward")
end)

T.test("make inspect's ring bytes are the program's hops", function()
    local inspect = require("inspect")
    for _, l in ipairs({ { cp = 2, tp = 2, mbs = 2 }, { cp = 4, bf16 = true },
                         { cp = 4, pp = 2, vp = 2, nmb = 4, sp = true, tp = 2 } }) do
        local cfg, topo, part, sh, sched, p = F.build({ layers = 8 }, l)
        local t = inspect.cp_traffic(cfg)
        local es = cfg.bf16 and 2 or 4
        for _, sp in ipairs(p.stages) do
            local sent, layers = { F = 0, B = 0 }, 0
            for _, ch in ipairs(sp.chunks) do layers = layers + ch.layers end
            for _, o in ipairs(sp.schedule) do
                if o.kind == "F" or o.kind == "B" then
                    for _, c in ipairs(o.comm) do
                        if c.op == "ring" then
                            sent[o.kind] = sent[o.kind] + c.n * es + (c.n2 or 0) * 4
                        end
                    end
                end
            end
            local per = layers * cfg.nmb
            T.eq({ sent.F, sent.B }, { per * t.forward, per * t.backward },
                 string.format("cp %d stage %d: bytes per step", cfg.cp, sp.stage))
        end
        local text = inspect.rank(cfg, topo, part, sh, sched, p, 0)
        T.ok(text:find("context parallelism: CP " .. cfg.cp, 1, true), "report names CP")
    end
end)

-- A ring of CP ranks with 'n' identical hops of K|V and dK|dV (next, prev); 'edit' breaks it.
local function ring(CP, n, edit)
    local ranks = {}
    for r = 0, CP - 1 do
        local list = {}
        for i = 1, n do
            list[i] = { what = "hop " .. i, ops = {
                { send = true, peer = (r + 1) % CP, tag = 2, n = 10 },
                { send = true, peer = (r + 1) % CP, tag = 3, n = 10 },
                { send = false, peer = (r + CP - 1) % CP, tag = 2, n = 10 },
                { send = false, peer = (r + CP - 1) % CP, tag = 3, n = 10 } } }
        end
        ranks[r + 1] = list
    end
    if edit then edit(ranks) end
    return { CP = CP, ranks = ranks }
end

T.test("the ring verifier: the program's rings pass", function()
    for _, l in ipairs({ { cp = 2 }, { cp = 4, pp = 2, vp = 2, nmb = 4 },
                         { cp = 2, tp = 2, sp = true, recompute = "selective" } }) do
        l.layers = nil
        local _, _, _, _, _, p = F.build({ layers = 8 }, l)
        local cfg = F.config({ layers = 8 }, l)
        for _, sp in ipairs(p.stages) do
            for _, tr in ipairs({ "mpi", "nccl" }) do
                local ok, why = verify.check_ring(program.ring_events(sp, cfg), { transport = tr })
                T.ok(ok, "cp %d stage %d %s: %s", l.cp, sp.stage, tr,
                     why and table.concat(why, " / ") or "")
            end
        end
    end
    for _, CP in ipairs({ 2, 3, 8 }) do
        T.ok(verify.check_ring(ring(CP, 5)), "a plain ring of %d", CP)
    end
end)

T.test("the ring verifier refuses broken rings with a counterexample", function()
    -- cp rank 1 skips its last hop (as if it knew the block was hidden by the mask)
    local ok, why = verify.check_ring(ring(4, 3, function(r) table.remove(r[2]) end))
    T.ok(not ok, "a skipped hop is refused")
    T.eq(why[1], "the cp ring deadlocks:", "deadlock reported")
    T.ok(why[2]:match("^cp rank 0 waits at hop 3 %(hop 3%)"), "names the rank: %s", why[2])
    -- cp rank 2 receives from its next rank instead of its previous one
    ok, why = verify.check_ring(ring(4, 2, function(r)
        for _, h in ipairs(r[3]) do h.ops[3].peer, h.ops[4].peer = 3, 3 end
    end))
    T.ok(not ok and why[1] == "the cp ring deadlocks:", "a receive from the wrong side hangs")
    -- cp rank 0 sends a block of another size
    ok, why = verify.check_ring(ring(2, 1, function(r) r[1][1].ops[1].n = 12 end),
                                { where = "the cp ring of stage 0" })
    T.ok(not ok, "a count mismatch is refused")
    T.eq(why[1], "the cp ring of stage 0: cp rank 0 (hop 1) would send 12 elements (tag 2) " ..
         "to cp rank 1, but cp rank 1 (hop 1) would receive 10 elements (tag 2) from cp rank 0",
         "names both ends")
    -- on NCCL (no tags) a rank that posts dK|dV before K|V to the same peer still matches:
    -- the runtime sorts each call's ops by (peer, tag)
    ok = verify.check_ring(ring(2, 2, function(r)
        local o = r[1][1].ops
        o[1], o[2] = o[2], o[1]
    end), { transport = "nccl" })
    T.ok(ok, "posting order inside a hop does not matter")
end)

T.test("the ring verifier's fast path (every rank alike) agrees with the simulation", function()
    local function same(edit)
        local hops = {}
        for i = 1, 3 do
            hops[i] = { what = "hop " .. i, ops = {
                { send = true, delta = 1, tag = 2, n = 10 },
                { send = true, delta = 1, tag = 3, n = 10 },
                { send = false, delta = -1, tag = 2, n = 10 },
                { send = false, delta = -1, tag = 3, n = 10 } } }
        end
        if edit then edit(hops) end
        return hops
    end
    for _, CP in ipairs({ 2, 3, 4 }) do
        for _, tr in ipairs({ "mpi", "nccl" }) do
            T.ok(verify.ring_hops_pair(same(), CP, tr == "nccl"), "a sound ring pairs up (%d)", CP)
            T.ok(verify.check_ring({ CP = CP, same = same() }, { transport = tr }), "and passes")
        end
        -- hop 2 receives 12 elements of K|V where 10 are sent
        local bad = same(function(h) h[2].ops[3].n = 12 end)
        T.ok(not verify.ring_hops_pair(bad, CP, false), "counts that disagree do not pair (%d)", CP)
        local ok, why = verify.check_ring({ CP = CP, same = bad })
        T.ok(not ok and why[1]:find("would send 10 elements (tag 2)", 1, true),
             "the simulation gives the counterexample: %s", why and why[1] or "")
        -- every rank receives from its next rank instead of its previous one (CP > 2: a hang)
        if CP > 2 then
            local wrong = same(function(h) for _, x in ipairs(h) do
                x.ops[3].delta, x.ops[4].delta = 1, 1 end end)
            T.ok(not verify.ring_hops_pair(wrong, CP, false), "wrong side does not pair (%d)", CP)
            ok, why = verify.check_ring({ CP = CP, same = wrong })
            T.ok(not ok and why[1] == "the cp ring deadlocks:", "and hangs in the simulation")
        end
    end
end)

T.done()
