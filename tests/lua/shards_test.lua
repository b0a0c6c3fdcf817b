-- tests/lua/shards_test.lua: parameter shards, counts and bytes.
-- The exact parameter counts of the shipped models derived from the architecture formula;
-- Megatron's TP splits on examples; tiling (the pieces of every parameter cover it exactly
-- once across each TP group, and each expert once across each expert tp-ep group) over random
-- configurations; reduce groups; the distributed-optimizer layout on a hand-worked example;
-- bytes against the byte table of docs/megatron.md §5.7.
-- Run: build/gen --lua tests/lua/shards_test.lua

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
require("strict")
local T = require("harness")("shards")
local F = require("fixtures")
local config = require("config")
local diag = require("diag")
local partition = require("partition")
local shards = require("shards")
local topology = require("topology")
local util = require("util")

local function build(model, opts)
    local cfg = config.configure(model, opts)
    local topo = topology.build(cfg)
    local part = partition.build(cfg, topo)
    return cfg, topo, part, shards.build(cfg, topo, part)
end

local function find(cls, name, tied)
    for _, p in ipairs(cls.params) do
        if p.name == name and p.tied == (tied or false) then return p end
    end
end

-- -- Counts --------------------------------------------------------------------------------------

-- A GPT-2-style layer holds ln_1 (2C), c_attn (C*3C + 3C), attn c_proj (C*C + C), ln_2 (2C),
-- c_fc (C*4C + 4C), mlp c_proj (4C*C + C): 12C^2 + 13C. The model adds wte (V*C), wpe (S*C)
-- and ln_f (2C). Padded vocab rows and the last stage's tied wte copy are not parameters.
local function gpt_count(L, C, V, S)
    return L * (12 * C * C + 13 * C) + V * C + S * C + 2 * C
end

T.test("gpt3_175b: exact unique count from the formula", function()
    local model = config.load_model("gpt3_175b")
    local want = gpt_count(96, 12288, 50257, 2048)
    local cfg, topo, _, sh = build(model, { tp = 8, pp = 8 })
    T.eq(sh.unique, want, "unique")
    T.eq(sh.unique_expert, 0, "no experts")
    -- the pieces held by one data-parallel replica add up to the same count
    local sum = 0
    for r = 0, cfg.world - 1 do
        local c = topology.coords(topo, r)
        if c.dp == 0 and c.cp == 0 then
            for _, p in ipairs(shards.class_of(sh, r).params) do
                if not p.tied and (p.tp_sharded or c.tp == 0) then
                    for _, pc in ipairs(p.pieces) do sum = sum + util.product(pc.size) end
                end
            end
        end
    end
    T.eq(sum, want, "pieces of one replica")
end)

T.test("gpt2 family counts", function()
    local sizes = { gpt2_124m = { 12, 768 }, gpt2_350m = { 24, 1024 }, gpt2_774m = { 36, 1280 },
                    gpt2_1558m = { 48, 1600 } }
    for name, s in util.sortedpairs(sizes) do
        local model = config.load_model(name)
        local _, _, _, sh = build(model, {})
        T.eq(sh.unique, gpt_count(s[1], s[2], 50257, 1024), name)
    end
    -- the figure Hugging Face and nanoGPT report for GPT-2 small
    T.eq(gpt_count(12, 768, 50257, 1024), 124439808, "GPT-2 124M")
end)

T.test("MoE counts: router and experts replace the MLP", function()
    local model = config.load_model("tiny_moe")
    local _, _, _, sh = build(model, { ep = 2, dp = 2 })
    local C, F, E, L = 64, 128, 8, 4
    local expert = L * E * (C * F + F * C)   -- tiny_moe: add_bias_linear = false, no biases
    -- attention 4C^2, two norms 4C, router E*C; then wte, wpe, ln_f
    local dense = L * (4 * C * C + 4 * C + E * C) + 256 * C + 64 * C + 2 * C
    T.eq(sh.unique_expert, expert, "experts")
    T.eq(sh.unique_dense, dense, "dense")
    T.eq(sh.unique, dense + expert, "total")
end)

-- -- Splits ------------------------------------------------------------------------------------

T.test("c_attn column-parallel by heads: q_t|k_t|v_t", function()
    local model = F.model({ hidden = 64, heads = 4 })
    local _, _, _, sh = build(model, { tp = 4 })
    for t = 0, 3 do
        local p = find(shards.class_of(sh, t), "h.0.attn.c_attn.weight")
        T.eq(p.shape, { 64, 192 }, "global")
        T.eq(p.local_shape, { 64, 48 }, "local")
        T.eq(#p.pieces, 3, "q, k, v")
        for j = 0, 2 do
            local pc = p.pieces[j + 1]
            T.eq(pc.start, { 0, j * 64 + t * 16 }, "start")
            T.eq(pc.size, { 64, 16 }, "size")
            T.eq(pc.at, { 0, j * 16 }, "local position")
        end
        local b = find(shards.class_of(sh, t), "h.0.attn.c_attn.bias")
        T.eq(b.pieces[3].start, { 128 + t * 16 }, "v bias")
        T.ok(p.tp_sharded and b.tp_sharded, "sharded")
    end
end)

T.test("row-parallel projections, replicated row biases and norms", function()
    local model = F.model({ hidden = 64, heads = 4 })
    local _, _, _, sh = build(model, { tp = 2 })
    local c1 = shards.class_of(sh, 1)
    local w = find(c1, "h.1.mlp.c_proj.weight")
    T.eq({ w.shape, w.local_shape, w.pieces[1].start, w.split }, { { 256, 64 }, { 128, 64 },
         { 128, 0 }, "row" }, "mlp c_proj")
    local fc = find(c1, "h.1.mlp.c_fc.weight")
    T.eq({ fc.local_shape, fc.pieces[1].start, fc.split }, { { 64, 128 }, { 0, 128 }, "column" },
         "mlp c_fc")
    local fcb = find(c1, "h.1.mlp.c_fc.bias")
    T.eq({ fcb.local_shape, fcb.pieces[1].start }, { { 128 }, { 128 } }, "c_fc bias split")
    for _, name in ipairs({ "h.1.mlp.c_proj.bias", "h.1.attn.c_proj.bias", "h.1.ln_1.weight",
                            "h.1.ln_2.bias", "ln_f.weight" }) do
        local p = find(c1, name)
        T.ok(not p.tp_sharded and p.tp_duplicate, "%s: replicated, a duplicate on tp rank 1", name)
        T.eq(p.local_shape, p.shape, name)
        local p0 = find(shards.class_of(sh, 0), name)
        T.ok(not p0.tp_duplicate, "%s: tp rank 0 is not a duplicate", name)
    end
end)

T.test("vocab-parallel wte with Megatron's padding", function()
    local model = config.load_model("gpt2_350m")
    local cfg, _, _, sh = build(model, { tp = 8 })
    T.eq(cfg.vocab_padded, 51200, "50257 padded to a multiple of 128*8")
    local last = find(shards.class_of(sh, 7), "wte.weight")
    T.eq(last.local_shape, { 6400, 1024 }, "local rows")
    T.eq(last.pieces[1].start, { 44800, 0 }, "start")
    T.eq(last.pieces[1].size, { 50257 - 44800, 1024 }, "real rows only")
    local cfg1 = config.configure(model, {})
    T.eq(cfg1.vocab_padded, 50304, "TP 1: multiple of 128")
    -- a small vocabulary: ranks past it hold padding only
    local _, _, _, tiny = build(F.model({ vocab = 256, heads = 8 }), { tp = 8 })
    T.eq(#find(shards.class_of(tiny, 1), "wte.weight").pieces, 1, "rank 1 holds rows 128..255")
    T.eq(#find(shards.class_of(tiny, 2), "wte.weight").pieces, 0, "rank 2 holds padding only")
end)

T.test("tied wte copy on the last stage when PP > 1", function()
    local model = F.model({ layers = 4 })
    local cfg, _, _, sh = build(model, { pp = 2, vp = 2, nmb = 2, dp = 2 })
    local first, last = shards.class_of(sh, 0), shards.class_of(sh, cfg.world - 1)
    local wte, tied = find(first, "wte.weight"), find(last, "wte.weight", true)
    T.ok(wte and tied, "both copies")
    T.eq({ wte.chunk, tied.chunk }, { 0, 1 }, "chunks: first stage chunk 0, last stage chunk V-1")
    T.eq(wte.reduce, { "dp-cp", "embd" }, "wte reduce")
    T.eq(tied.reduce, { "dp-cp", "embd" }, "tied reduce")
    T.ok(wte.shared_embedding and tied.shared_embedding and tied.tied and not wte.tied, "flags")
    local _, _, _, one = build(model, { dp = 2 })
    local w1 = find(one.classes[1], "wte.weight")
    T.eq(w1.reduce, { "dp-cp" }, "PP 1: no embedding group")
    T.ok(not w1.shared_embedding and find(one.classes[1], "wte.weight", true) == nil, "no copy")
end)

T.test("reduce groups with SP, CP and experts", function()
    local model = F.model({ moe = { experts = 4, top_k = 2 } })     -- biases: ETP 1
    local _, _, _, sh = build(model, { tp = 2, cp = 2, dp = 2, ep = 2, etp = 1, sp = true })
    local c = sh.classes[1]
    T.eq(find(c, "h.0.ln_1.weight").reduce, { "dp-cp", "tp" }, "norm under SP")
    T.eq(find(c, "h.0.attn.c_proj.bias").reduce, { "dp-cp", "tp" }, "row bias under SP")
    T.eq(find(c, "h.0.mlp.router.weight").reduce, { "dp-cp", "tp" }, "router under SP")
    T.eq(find(c, "h.0.mlp.router.bias").reduce, { "dp-cp", "tp" }, "router bias under SP")
    T.eq(find(c, "h.0.mlp.experts.0.c_proj.bias").reduce, { "expt-dp" }, "expert bias")
    T.eq(find(c, "h.0.attn.c_attn.weight").reduce, { "dp-cp" }, "column weight")
    T.eq(find(c, "h.0.mlp.experts.0.c_fc.weight").reduce, { "expt-dp" }, "expert")
    T.eq(find(c, "h.0.mlp.experts.0.c_fc.weight").buffer, "expert", "expert buffer")
    -- EP 1 and ETP = TP: expert weights live in the dense buffer (Megatron's allreduce=True)
    model = F.model({ add_bias_linear = false, moe = { experts = 4, top_k = 2 } })
    local _, _, _, sh2 = build(model, { tp = 2, dp = 2 })
    for _, name in ipairs({ "h.0.attn.c_attn.bias", "h.0.attn.c_proj.bias", "h.0.mlp.router.bias",
                            "h.0.mlp.experts.3.c_fc.bias" }) do
        T.ok(find(sh2.classes[1], name, true) == nil, "add_bias_linear = false: no " .. name)
    end
    local e = find(sh2.classes[1], "h.0.mlp.experts.3.c_fc.weight")
    T.eq({ e.buffer, e.reduce }, { "dense", { "dp-cp" } }, "EP 1, ETP = TP")
end)

-- -- Tiling over random configurations ----------------------------------------------------------

local function overlap(a, b)
    for d = 1, #a.start do
        if not (a.start[d] < b.start[d] + b.size[d] and b.start[d] < a.start[d] + a.size[d]) then
            return false
        end
    end
    return true
end

-- The pieces tile 'shape' exactly: inside it, pairwise disjoint, volumes adding up.
local function tiles(shape, pieces, what)
    local sum = 0
    for i, p in ipairs(pieces) do
        for d = 1, #shape do
            T.ok(p.start[d] >= 0 and p.size[d] >= 1 and p.start[d] + p.size[d] <= shape[d],
                 "%s: piece %d outside the tensor", what, i)
        end
        for j = 1, i - 1 do
            T.ok(not overlap(p, pieces[j]), "%s: pieces %d and %d overlap", what, j, i)
        end
        sum = sum + util.product(p.size)
    end
    T.eq(sum, util.product(shape), what .. ": covered volume")
end

-- Local placement: pieces sit inside the local tensor without overlapping.
local function placed(p)
    local loc = {}
    for i, pc in ipairs(p.pieces) do
        loc[i] = { start = pc.at, size = pc.size }
        for d = 1, #p.local_shape do
            T.ok(pc.at[d] + pc.size[d] <= p.local_shape[d], "%s: piece outside local", p.name)
        end
    end
    for i = 1, #loc do
        for j = 1, i - 1 do
            T.ok(not overlap(loc[i], loc[j]), "%s: local pieces overlap", p.name)
        end
    end
end

local function check(cfg, topo, sh)
    -- every global tensor is held by exactly one stage (the tied copy aside)
    local where, global = {}, {}
    for _, g in ipairs(shards.global_params(cfg.model)) do global[g.name] = g.shape end
    for _, c in ipairs(sh.classes) do
        for _, p in ipairs(c.params) do
            placed(p)
            T.ok(global[p.name] ~= nil, "%s is not a model tensor", p.name)
            T.eq(p.shape, global[p.name], p.name .. ": global shape")
            if p.tied then
                T.ok(c.pp == cfg.pp - 1 and cfg.pp > 1, "tied copy off the last stage")
            else
                T.ok(where[p.name] == nil or where[p.name] == c.pp, "%s on two stages", p.name)
                where[p.name] = c.pp
            end
        end
    end
    for name in pairs(global) do T.ok(where[name] ~= nil, "%s held nowhere", name) end
    -- dense tensors tile across each tp group, experts across each tp-ep group
    local function across(kind_name, want_expert)
        local kind, done = topology.kind(topo, kind_name), {}
        for g = 0, kind.count - 1 do
            local classes = {}
            for j, r in ipairs(topology.members(kind, g)) do
                classes[j] = shards.class_of(sh, r).id
            end
            local key = table.concat(classes, ",")
            if not done[key] then
                done[key] = true
                local by_name = {}
                for _, id in ipairs(classes) do
                    for _, p in ipairs(sh.classes[id + 1].params) do
                        if p.expert == want_expert then
                            local k = p.name .. (p.tied and "#tied" or "")
                            by_name[k] = by_name[k] or { shape = p.shape, pieces = {}, reps = {} }
                            local e = by_name[k]
                            if p.tp_sharded then
                                for _, pc in ipairs(p.pieces) do e.pieces[#e.pieces + 1] = pc end
                            else
                                e.reps[#e.reps + 1] = p
                            end
                        end
                    end
                end
                for name, e in util.sortedpairs(by_name) do
                    if #e.reps > 0 then
                        T.eq(#e.pieces, 0, name .. ": both split and replicated")
                        T.eq(#e.reps, kind.size // (want_expert and cfg.ep or 1),
                             name .. ": replicas")
                        for _, p in ipairs(e.reps) do tiles(p.shape, p.pieces, name) end
                    else
                        tiles(e.shape, e.pieces, name .. " across " .. kind_name)
                    end
                end
            end
        end
    end
    across("tp", false)
    across("tp-ep", true)
    -- class bookkeeping, against every rank (the pass counts them from the grids' structure)
    local count, first = {}, {}
    for r = 0, cfg.world - 1 do
        local c, co = shards.class_of(sh, r), topology.coords(topo, r)
        count[c.id] = (count[c.id] or 0) + 1
        first[c.id] = first[c.id] or r
        T.ok(c.pp == co.pp and c.tp == co.tp, "class of rank %d", r)
        if cfg.model.moe then T.ok(c.ep == co.ep and c.etp == co.etp, "expert class of %d", r) end
    end
    for i, c in ipairs(sh.classes) do
        T.eq({ count[c.id], first[c.id] }, { c.ranks, c.first }, "ranks and lowest rank in class")
        T.eq(c.id, i - 1, "ids in class order")
        if i > 1 then T.ok(c.first > sh.classes[i - 1].first, "classes by lowest rank") end
    end
end

T.test("random configurations: pieces tile every tensor", function()
    local rnd = T.random(5)
    local accepted = 0
    for _ = 1, 120 do
        local pick = function(list) return list[rnd(1, #list)] end
        local tp, pp = pick({ 1, 2, 4 }), pick({ 1, 2, 4 })
        local cp, dp = pick({ 1, 2 }), pick({ 1, 2, 3 })
        local moe = rnd(0, 1) == 1
        local opts = { tp = tp, pp = pp, cp = cp, dp = dp, nmb = pp,
                       vp = (pp > 1 and rnd(0, 1) == 1) and 2 or nil,
                       sp = tp > 1 and rnd(0, 1) == 1 or nil }
        local fields = { layers = pp * 4, hidden = 16 * tp, heads = 2 * tp, seq_len = 8 * cp * tp,
                         vocab = pick({ 50, 256, 1000 }), vocab_pad = pick({ 1, 8, 128 }) }
        if moe then
            opts.ep, opts.etp = pick({ 1, 2, 4 }), pick({ 1, 2 })
            opts.sp = (tp > 1 and opts.ep > 1) and true or opts.sp
            fields.moe = { experts = 8, top_k = 2, ffn_hidden = 24 }
            fields.add_bias_linear = opts.etp == 1 and rnd(0, 1) == 1
        end
        local ok, cfg = pcall(F.config, fields, opts)
        if ok then
            accepted = accepted + 1
            local topo = topology.build(cfg)
            local part = partition.build(cfg, topo)
            check(cfg, topo, shards.build(cfg, topo, part))
        elseif not diag.is_user_error(cfg) then
            error(cfg, 0)
        end
    end
    T.ok(accepted >= 60, "only %d valid configurations", accepted)
end)

T.test("gpt3_175b at 8192 ranks: 64 classes", function()
    local cfg, topo, _, sh = build(config.load_model("gpt3_175b"), { tp = 8, pp = 8, dp = 128 })
    T.eq(#sh.classes, 64, "classes = pp x tp")
    T.eq(sh.classes[64].ranks, 128, "ranks per class = dp")
    check(cfg, topo, sh)
end)

-- -- Distributed-optimizer layout and bytes ------------------------------------------------------

T.test("dist-opt layout, worked by hand", function()
    -- hidden 40, 1 layer, vocab 10 (padded to 128), seq 8, TP 1, PP 1, DP 3. Reverse order,
    -- each start rounded up to 64:
    --   ln_f.bias 0+40, ln_f.weight 64+40, mlp.c_proj.bias 128+40, mlp.c_proj.weight
    --   192+6400, mlp.c_fc.bias 6592+160, mlp.c_fc.weight 6784+6400, ln_2.bias 13184+40,
    --   ln_2.weight 13248+40, c_attn.bias 13312+120, c_attn.weight 13440+4800,
    --   attn.c_proj.bias 18240+40, attn.c_proj.weight 18304+1600, ln_1.bias 19904+40,
    --   ln_1.weight 19968+40, wpe 20032+320, wte 20352+5120 = 25472 (25240 elements),
    -- padded to lcm(3, 128) = 384: 67 * 384 = 25728; each of 3 ranks owns 8576.
    local model = F.model({ layers = 1, hidden = 40, heads = 4, seq_len = 8, vocab = 10 })
    local _, _, _, sh = build(model, { dp = 3 })
    local c = sh.classes[1]
    T.eq(#c.buffers, 1, "one buffer")
    local b = c.buffers[1]
    T.eq({ b.numel, b.size, b.shard, b.dp_shards, #b.buckets }, { 25240, 25728, 8576, 3, 1 },
         "buffer")
    local offsets = {}
    for _, s in ipairs(b.buckets[1].slots) do offsets[#offsets + 1] = s.offset end
    T.eq(offsets, { 0, 64, 128, 192, 6592, 6784, 13184, 13248, 13312, 13440, 18240, 18304,
                    19904, 19968, 20032, 20352 }, "offsets")
    T.eq(b.buckets[1].slots[1].name, "ln_f.bias", "last param first")
    T.eq(b.buckets[1].slots[16].name, "wte.weight", "first param last")
    local fp16 = shards.bytes_of(c, "fp16", true)
    T.eq({ fp16.params, fp16.grads, fp16.optim }, { 2 * 25728, 2 * 25728, 16 * 8576 }, "bytes")
end)

T.test("dist-opt: the tied embedding gets a bucket of its own", function()
    local model = F.model({ layers = 2, hidden = 40, heads = 4, seq_len = 8, vocab = 10 })
    local cfg, _, _, sh = build(model, { pp = 2, dp = 2 })
    for _, c in ipairs(sh.classes) do
        local b = c.buffers[1]
        T.eq(#b.buckets, 2, "two buckets on stage " .. c.pp)
        local alone = (c.pp == 0) and b.buckets[2] or b.buckets[1]
        T.eq(#alone.slots, 1, "one slot")
        T.eq(alone.slots[1].name, "wte.weight", "the embedding")
        for _, bk in ipairs(b.buckets) do
            T.eq(bk.size % util.lcm(cfg.dp, 128), 0, "bucket padded")
            T.eq(bk.start % 64, 0, "bucket aligned")
        end
    end
end)

T.test("bytes per parameter: the table of docs/megatron.md 5.7", function()
    local model = config.load_model("gpt3_175b")
    for _, d in ipairs({ 1, 8, 64 }) do
        local _, _, _, sh = build(model, { tp = 8, pp = 8, dp = d })
        for _, c in ipairs(sh.classes) do
            local per = { fp16 = 20, ["bf16-fp32"] = 18, fp32 = 16 }
            local dist = { fp16 = { 4, 16 }, ["bf16-fp32"] = { 6, 12 }, fp32 = { 8, 8 } }
            for name, n in pairs(per) do
                T.eq(shards.bytes_of(c, name, false).total, n * c.numel, name .. " no dist-opt")
                local b = shards.bytes_of(c, name, true)
                local size = 0
                for _, buf in ipairs(c.buffers) do size = size + buf.size end
                T.eq(size % d, 0, "padded to the dp size")
                T.eq(b.total, dist[name][1] * size + dist[name][2] * (size // d),
                     name .. " dist-opt")
                T.ok(size >= c.numel and size - c.numel < 64 * #c.params + 2 * util.lcm(d, 128),
                     "padding is small")
            end
        end
    end
end)

T.done()
