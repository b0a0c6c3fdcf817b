-- tests/lua/distopt_test.lua: the distributed optimizer's per-rank shards as `make inspect
-- RANK=r` reports them (inspect.optimizer_shard, inspect.distopt_rank): the three
-- index ranges (world, local, param) on a hand-worked layout with a parameter that straddles
-- two shards; the same ranges recomputed element by element (owner of every buffer element)
-- for several layouts, padding and buckets included; and the bytes the report says the
-- distributed optimizer saves, against the byte table (docs/megatron.md §5.7).
-- Run: build/gen --lua tests/lua/distopt_test.lua

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
require("strict")
local T = require("harness")("distopt")
local F = require("fixtures")
local inspect = require("inspect")
local shards = require("shards")
local topology = require("topology")

-- A 1-layer model small enough to lay out by hand: hidden 8, 2 heads, 4 positions, vocab 10
-- (padded to 128 rows at TP 1).
local SMALL = { layers = 1, hidden = 8, heads = 2, seq_len = 4, vocab = 10 }

local function piece_of(os_, name)
    for _, b in ipairs(os_.buffers) do
        for _, k in ipairs(b.buckets) do
            for _, pc in ipairs(k.pieces) do
                if pc.name == name then return pc, k, b end
            end
        end
    end
end

-- Worked by hand. Buffer order is the reverse of named_parameters; every start is rounded up
-- to 64 elements:
--   ln_f.bias 0, ln_f.weight 64, mlp.c_proj.bias 128, mlp.c_proj.weight [192, 448),
--   mlp.c_fc.bias [448, 480), mlp.c_fc.weight [512, 768), ln_2.bias 768, ln_2.weight 832,
--   attn.c_attn.bias [896, 920), attn.c_attn.weight [960, 1152), attn.c_proj.bias 1152,
--   attn.c_proj.weight [1216, 1280), ln_1.bias 1280, ln_1.weight 1344, wpe [1408, 1440),
--   wte [1472, 2496) (128 x 8, padded vocabulary).
-- The end, 2496, is padded to a multiple of lcm(3, 128) = 384: 2688, so shards of 896.
-- Rank 1 holds [896, 1792): c_attn.bias at its start and the first 320 elements of wte;
-- rank 2 holds [1792, 2688): the remaining 704 elements of wte, then 192 of padding.
T.test("hand-worked DP 3 layout with a straddling wte", function()
    local cfg, topo, _, sh, sched, prog = F.build(SMALL, { dp = 3, dist_opt = true })
    local r0, r1, r2 = inspect.optimizer_shard(cfg, topo, sh, 0),
                       inspect.optimizer_shard(cfg, topo, sh, 1),
                       inspect.optimizer_shard(cfg, topo, sh, 2)
    T.eq({ r1.group, r1.shards, r1.pos }, { "dp-cp", 3, 1 }, "rank 1's group and position")
    local b = r1.buffers[1]
    T.eq({ b.size, b.numel, b.shard, #b.buckets }, { 2688, 1944, 896, 1 }, "buffer")
    local k = b.buckets[1]
    T.eq({ k.lo, k.hi, k.base, k.padding }, { 896, 1792, 0, 240 }, "rank 1's shard")
    local want = {
        { "h.0.attn.c_attn.bias", { 896, 920 }, { 0, 24 }, { 0, 24 } },
        { "h.0.attn.c_attn.weight", { 960, 1152 }, { 64, 256 }, { 0, 192 } },
        { "h.0.attn.c_proj.bias", { 1152, 1160 }, { 256, 264 }, { 0, 8 } },
        { "h.0.attn.c_proj.weight", { 1216, 1280 }, { 320, 384 }, { 0, 64 } },
        { "h.0.ln_1.bias", { 1280, 1288 }, { 384, 392 }, { 0, 8 } },
        { "h.0.ln_1.weight", { 1344, 1352 }, { 448, 456 }, { 0, 8 } },
        { "wpe.weight", { 1408, 1440 }, { 512, 544 }, { 0, 32 } },
        { "wte.weight", { 1472, 1792 }, { 576, 896 }, { 0, 320 } },
    }
    local got = {}
    for i, pc in ipairs(k.pieces) do got[i] = { pc.name, pc.world, pc.loc, pc.param } end
    T.eq(got, want, "rank 1's pieces (name, world, local, param)")
    local last = r2.buffers[1].buckets[1]
    T.eq(#last.pieces, 1, "rank 2 holds one piece")
    local pc = last.pieces[1]
    T.eq({ pc.name, pc.world, pc.loc, pc.param, last.padding },
         { "wte.weight", { 1792, 2496 }, { 0, 704 }, { 320, 1024 }, 192 }, "rank 2's wte")
    T.eq(r0.buffers[1].buckets[1].pieces[#r0.buffers[1].buckets[1].pieces].name,
         "h.0.ln_2.weight", "rank 0 ends with ln_2.weight")
    T.ok(piece_of(r0, "wte.weight") == nil, "rank 0 holds no wte")
end)

T.test("the report prints the ranges and the other owners", function()
    local cfg, topo, part, sh, sched, prog = F.build(SMALL, { dp = 3, dist_opt = true })
    local text = inspect.rank(cfg, topo, part, sh, sched, prog, 1)
    T.ok(text:find("distributed optimizer: rank 1 is dp-cp rank 1 of 3", 1, true),
         "headline missing")
    T.ok(text:find("this rank: world [896, 1792), local [0, 896), 240 padding", 1, true),
         "shard line missing")
    T.ok(text:find("wte.weight%s+%[1472, 1792%)%s+%[576, 896%)%s+%[0, 320%)%s+1024"),
         "wte row missing")
    T.ok(text:find("straddles: the rest on dp-cp rank 2", 1, true), "straddle note missing")
    -- without DIST_OPT there is no such section
    local c2, t2, p2, s2, q2, g2 = F.build(SMALL, { dp = 3 })
    T.ok(not inspect.rank(c2, t2, p2, s2, q2, g2, 1):find("distributed optimizer: rank", 1, true),
         "section shown without DIST_OPT")
end)

-- -- Element by element ------------------------------------------------------------------------

-- Recompute every rank's pieces from the owner of each buffer element: element e of bucket k
-- belongs to the rank at position (e - start) // (size / D) of the reduce group. Returns
-- pos -> list of {name, world, loc, param} in buffer order, for one buffer.
local function by_element(b)
    local D = b.dp_shards
    local pieces, base = {}, {}
    local acc = 0
    for ki, bk in ipairs(b.buckets) do
        base[ki] = acc
        acc = acc + bk.size // D
    end
    for d = 0, D - 1 do pieces[d] = {} end
    for ki, bk in ipairs(b.buckets) do
        local shard = bk.size // D
        for _, s in ipairs(bk.slots) do
            local cur
            for e = s.offset, s.offset + s.numel - 1 do
                local d = (e - bk.start) // shard
                if not cur or cur.d ~= d then
                    cur = { d = d, name = s.name, world = { e, e + 1 },
                            loc = { base[ki] + e - bk.start - d * shard, 0 },
                            param = { e - s.offset, 0 } }
                    local list = pieces[d]
                    list[#list + 1] = cur
                else
                    cur.world[2] = e + 1
                end
                cur.loc[2] = base[ki] + e + 1 - bk.start - d * shard
                cur.param[2] = e + 1 - s.offset
            end
        end
    end
    return pieces
end

local CASES = {
    { "tp2 dp2", { layers = 2, hidden = 16, heads = 2, seq_len = 8, vocab = 50 },
      { tp = 2, dp = 2, dist_opt = true } },
    { "dp3 odd sizes", { layers = 2, hidden = 35, heads = 5, seq_len = 30, vocab = 97,
                         vocab_pad = 1 }, { dp = 3, dist_opt = true } },
    { "pp2 dp4: tied wte in buckets of its own", { layers = 2, hidden = 16, heads = 2,
                                                   seq_len = 8, vocab = 50 },
      { pp = 2, dp = 4, dist_opt = true } },
    { "pp2 vp2 dp2: a buffer per chunk", { layers = 4, hidden = 16, heads = 2, seq_len = 8,
                                           vocab = 50 },
      { pp = 2, vp = 2, dp = 2, nmb = 2, dist_opt = true } },
    { "cp2 dp3: shards over dp-cp", { layers = 1, hidden = 16, heads = 2, seq_len = 8,
                                      vocab = 50 }, { cp = 2, dp = 3, dist_opt = true } },
    { "moe ep2: expert buffers over expt-dp",
      { layers = 1, hidden = 16, heads = 2, seq_len = 8, vocab = 50,
        add_bias_linear = false, moe = { experts = 4, top_k = 2 } },
      { tp = 2, ep = 2, dp = 4, sp = true, dist_opt = true } },
}

for _, case in ipairs(CASES) do
    T.test("ranges element by element: " .. case[1], function()
        local cfg, topo, _, sh, sched, prog = F.build(case[2], case[3])
        local straddles = 0
        for r = 0, cfg.world - 1 do
            local cls = shards.class_of(sh, r)
            local os_ = inspect.optimizer_shard(cfg, topo, sh, r)
            T.eq(#os_.buffers, #cls.buffers, "buffers of rank " .. r)
            for bi, b in ipairs(cls.buffers) do
                local group = b.kind == "expert" and "expt-dp" or "dp-cp"
                local _, pos = topology.group_of(topo, group, r)
                local want = by_element(b)[pos]
                local got = {}
                for _, k in ipairs(os_.buffers[bi].buckets) do
                    for _, pc in ipairs(k.pieces) do
                        got[#got + 1] = { name = pc.name, world = pc.world, loc = pc.loc,
                                          param = pc.param }
                        if pc.param[2] - pc.param[1] < pc.numel then
                            straddles = straddles + 1
                        end
                    end
                end
                for _, w in ipairs(want) do w.d = nil end
                T.eq(got, want, string.format("rank %d buffer %d", r, bi - 1))
                -- shard = padding + the pieces, bucket by bucket
                for _, k in ipairs(os_.buffers[bi].buckets) do
                    local held = 0
                    for _, pc in ipairs(k.pieces) do held = held + pc.world[2] - pc.world[1] end
                    T.eq(held + k.padding, k.shard, "padding of rank " .. r)
                end
            end
        end
        if case[3].dp > 1 then T.ok(straddles > 0, "no parameter straddles a shard boundary") end
    end)
end

-- -- Bytes: the table of §5.7 ----------------------------------------------------------------------

T.test("bytes saved follow the table of docs/megatron.md 5.7", function()
    local cfg, topo, part, sh, sched, prog = F.build(SMALL, { dp = 3, dist_opt = true })
    local cls = shards.class_of(sh, 0)
    local numel = 0
    for _, p in ipairs(cls.params) do numel = numel + p.numel end
    T.eq(numel, 1944, "parameters held")
    -- without: 20, 18, 16 bytes per parameter; with: 4 + 16/d, 6 + 12/d, 8 + 8/d over the
    -- padded buffer (2688 elements, shard 896)
    local want = {
        fp16 = { 20 * 1944, 4 * 2688 + 16 * 896 },
        ["bf16-fp32"] = { 18 * 1944, 6 * 2688 + 12 * 896 },
        fp32 = { 16 * 1944, 8 * 2688 + 8 * 896 },
    }
    for name, w in pairs(want) do
        T.eq({ shards.bytes_of(cls, name, false).total, shards.bytes_of(cls, name, true).total },
             w, name)
    end
    local text = inspect.rank(cfg, topo, part, sh, sched, prog, 0)
    T.ok(text:find("4 + 16/d = 9.33", 1, true), "fp16 row")
    T.ok(text:find("6 + 12/d = 10.00", 1, true), "bf16/fp32 row")
    T.ok(text:find("8 + 8/d = 10.67", 1, true), "fp32 row")
    -- this program: f32 params, grads (whole buffer, reduced in place) + m, v (shard): 8 + 8/d
    T.ok(text:find("this program %(f32%)%s+16%s+8 %+ 8/d = 10%.67"), "program row")
end)

T.done()
