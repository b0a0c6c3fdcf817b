-- tests/moe/inspect_test.lua: the expert part of the per-rank report (inspect.moe_rank,
-- inspect.moe_traffic, inspect.moe_experts) and the parameter and memory figures of expert
-- shards, against numbers worked out by hand from the model's sizes. Run by tests/moe/suite.sh:
--   build/gen --lua tests/moe/inspect_test.lua      (prints PASS/FAIL lua/moe/<test>)

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
require("strict")
local T = require("harness")("moe")
local F = require("fixtures")
local inspect = require("inspect")
local shards = require("shards")
local topology = require("topology")

-- tiny_moe's sizes (models/tiny_moe.lua) as fixture fields, with 'moe' overrides; 'bias'
-- (default false) is the model's add_bias_linear.
local function tiny(moe)
    local m = { experts = 8, top_k = 2, ffn_hidden = 128, aux_loss_coeff = 0.01 }
    for k, v in pairs(moe or {}) do m[k] = v end
    local bias = m.bias == true
    m.bias = nil
    return { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256,
             add_bias_linear = bias, moe = m }
end

local function find_op(t, pass, group, what)
    for _, o in ipairs(t.ops) do
        if o.pass == pass and o.group == group and o.what == what then return o end
    end
    error(string.format("no %s op over %s: %s", pass, group, what), 2)
end

-- -- Traffic at a balanced load --------------------------------------------------------------

-- Seed 001's folding, TP 4 x PP 2 with ETP 1 x EP 4, micro-batches of 2 x 64 tokens: a tp rank
-- holds 128/4 = 32 tokens (SP), 64 choices, 16 to each of the 4 EP ranks (itself included).
-- A row is 64 f32 channels, plus its probability on the way out: 16 * 65 * 4 = 4,160 bytes per
-- peer, 3 peers off-rank = 12,480; outputs back 16 * 64 * 4 = 4,096 (12,288). The backward
-- mirrors it. Per layer and micro-batch 24,768 bytes each way off-rank; 66,048 sent in all.
T.test("traffic: the folding example (tp4 pp2 sp, etp1 ep4)", function()
    local cfg = F.config(tiny(), { tp = 4, pp = 2, sp = true, etp = 1, ep = 4, mbs = 2,
                                   nmb = 2 })
    local t = inspect.moe_traffic(cfg)
    T.eq({ t.tokens, t.choices, t.kept, t.rows_ep, t.rows_etp }, { 32, 64, 64, 16.0, 64 },
         "tokens, choices, kept, rows per EP peer, rows at the experts")
    T.eq(#t.ops, 4, "only EP all-to-alls (ETP 1)")
    local o = find_op(t, "forward", "ep", "rows + probs out")
    T.eq({ o.peers, o.rows, o.width, o.bytes, o.off, o.sent },
         { 4, 16.0, 65, 4160.0, 12480.0, 16640.0 }, "dispatch")
    o = find_op(t, "forward", "ep", "outputs back")
    T.eq({ o.bytes, o.off }, { 4096.0, 12288.0 }, "combine")
    o = find_op(t, "backward", "ep", "output grads out")
    T.eq({ o.bytes, o.off }, { 4096.0, 12288.0 }, "gradients out")
    o = find_op(t, "backward", "ep", "input + prob grads back")
    T.eq({ o.bytes, o.off }, { 4160.0, 12480.0 }, "gradients back")
    T.eq({ t.forward, t.backward, t.sent }, { 24768.0, 24768.0, 66048.0 }, "totals")
end)

-- TP 2 (SP) x DP 4 with ETP 2 x EP 4: 64 tokens and 128 choices per tp rank, 32 to each EP
-- peer (32 * 65 * 4 = 8,320 bytes, 24,960 off-rank); a rank's experts receive 4 * 32 = 128
-- rows, which the expert-TP pair all-gathers (128 * 65 * 4 = 33,280 bytes to the other
-- member) and reduce-scatters back (128 * 64 * 4 = 32,768).
T.test("traffic: ETP 2 (tp2 sp dp4, etp2 ep4)", function()
    local cfg = F.config(tiny(), { tp = 2, dp = 4, sp = true, etp = 2, ep = 4, mbs = 2 })
    local t = inspect.moe_traffic(cfg)
    T.eq({ t.tokens, t.choices, t.rows_ep, t.rows_etp }, { 64, 128, 32.0, 128 }, "rows")
    T.eq(#t.ops, 8, "EP and ETP collectives")
    local o = find_op(t, "forward", "ep", "rows + probs out")
    T.eq({ o.bytes, o.off }, { 8320.0, 24960.0 }, "dispatch")
    o = find_op(t, "forward", "expt-tp", "rows + probs")
    T.eq({ o.peers, o.rows, o.bytes, o.off, o.sent }, { 2, 128, 33280, 33280, 66560 },
         "ETP all-gather")
    o = find_op(t, "forward", "expt-tp", "partial outputs")
    T.eq({ o.bytes, o.off }, { 32768, 32768 }, "ETP reduce-scatter")
    o = find_op(t, "backward", "expt-tp", "output grads")
    T.eq(o.bytes, 32768, "ETP all-gather of the output gradients")
    o = find_op(t, "backward", "expt-tp", "input + prob grads")
    T.eq(o.bytes, 33280, "ETP reduce-scatter of the input gradients")
    -- off-rank: EP 24,960 + 24,576 each way; ETP 33,280 + 32,768 each way
    T.eq({ t.forward, t.backward }, { 115584.0, 115584.0 }, "totals")
end)

-- A capacity factor below 1 caps even a balanced load: cap = ceil(128*2/8 * 0.5) = 16 of the
-- 32 choices an expert gets, so half of them travel.
T.test("traffic: capacity 0.5 halves a balanced load", function()
    local cfg = F.config(tiny({ capacity_factor = 0.5 }), { dp = 2, ep = 2, mbs = 2 })
    local t = inspect.moe_traffic(cfg)
    T.eq({ t.capacity, t.choices, t.kept, t.rows_ep }, { 16, 256, 128.0, 64.0 }, "kept")
    T.eq(find_op(t, "forward", "ep", "rows + probs out").off, 64.0 * 65 * 4, "dispatch")
    -- factor 1 at a balanced load drops nothing
    cfg = F.config(tiny({ capacity_factor = 1.0 }), { dp = 2, ep = 2, mbs = 2 })
    t = inspect.moe_traffic(cfg)
    T.eq({ t.capacity, t.kept }, { 32, 256 }, "factor 1")
    -- under SP each tp rank drops among its own 64 tokens: cap = ceil(64*2/8 * 0.5) = 8 of
    -- its 128 choices' 16 per expert
    cfg = F.config(tiny({ capacity_factor = 0.5 }), { tp = 2, sp = true, ep = 2, etp = 1,
                                                      mbs = 2 })
    t = inspect.moe_traffic(cfg)
    T.eq({ t.capacity, t.choices, t.kept }, { 8, 128, 64.0 }, "per sequence shard")
    -- padding sends every expert exactly min(cap, N_SP) rows: factor 1.5 gives cap 24, more
    -- than the 16 of a balanced load
    cfg = F.config(tiny({ capacity_factor = 1.5, pad_to_capacity = true }),
                   { tp = 2, sp = true, ep = 2, etp = 1, mbs = 2 })
    t = inspect.moe_traffic(cfg)
    T.eq({ t.capacity, t.kept }, { 24, 8 * 24 }, "padded")
end)

T.test("traffic: none with EP 1 and ETP 1; nil for a dense model", function()
    local cfg = F.config(tiny(), { tp = 2, sp = true, etp = 1, dp = 2 })
    T.eq(#inspect.moe_traffic(cfg).ops, 0, "no collectives")
    T.eq(inspect.moe_traffic(F.config({}, { dp = 2 })), nil, "dense")
end)

-- -- Experts held, groups, report text --------------------------------------------------------

-- Every rank's experts (global ids) are those its shard records hold, contiguous per EP rank.
T.test("experts held: global ids match the shards", function()
    for _, opts in ipairs({ { tp = 4, pp = 2, sp = true, etp = 1, ep = 4 },
                            { tp = 2, dp = 4, sp = true, etp = 2, ep = 4 },
                            { dp = 4, ep = 2 }, { tp = 2, sp = true, dp = 2, ep = 2, etp = 2 } }) do
        local cfg, topo, _, sh, sched, prog = F.build(tiny(), opts)
        for r = 0, cfg.world - 1 do
            local lo, hi = inspect.moe_experts(cfg, topo, r)
            local ep = topology.coords(topo, r).ep
            T.eq({ lo, hi }, { ep * (8 // cfg.ep), ep * (8 // cfg.ep) + 8 // cfg.ep - 1 },
                 "range of rank " .. r)
            local ids = {}
            for _, p in ipairs(shards.class_of(sh, r).params) do
                if p.expert then ids[p.expert_id] = true end
            end
            for e = 0, 7 do
                T.eq(ids[e] == true, e >= lo and e <= hi, string.format("rank %d expert %d", r, e))
            end
        end
    end
end)

T.test("report: the folding example, rank 5", function()
    local cfg, topo, part, sh, sched, prog = F.build(tiny(), { tp = 4, pp = 2, sp = true, etp = 1, ep = 4,
                                                  mbs = 2, nmb = 2 })
    local text = inspect.rank(cfg, topo, part, sh, sched, prog, 5)
    local function has(s) T.ok(text:find(s, 1, true), "report lacks: %s", s) end
    has("  this rank    ep 1 of 4, expt-tp 0 of 1, expt-dp 0 of 1")
    has("  holds        experts 2-3 (global ids) of each of its 2 MoE layers (h.2-3)")
    has("  each         c_fc.weight whole [64, 128]")
    has("  expert grads not reduced (expt-dp has one member), scaled 1/(DP*CP) = 1/1 " ..
        "(expert buffer)")
    has("  router       h.i.mlp.router.weight [8, 64], replicated; grads: tp [4-7]")
    has("  grad norm    experts summed over tp-ep-pp [0-7]")
    has("    over ep [4-7]")
    has("    fwd   all-to-all  ep     rows + probs out                16   4,160      12,480")
    -- 2 layers x 2 micro-batches x 24,768 = 99,072 bytes = 96.75 KiB each way
    has("  per step     2 layers x 2 micro-batches: 96.75 KiB forward + 96.75 KiB backward")
    for line in text:gmatch("[^\n]+") do T.ok(#line <= 100, "line over 100 columns: %s", line) end
end)

T.test("report: expert-dp reduction, ETP slices, router over dp-cp and tp", function()
    local cfg, topo, part, sh, sched, prog = F.build(tiny(), { tp = 2, sp = true, dp = 4, ep = 2, etp = 2 })
    -- expert grid etp2-ep2-edp2: rank 5 is etp 1, ep 0, edp 1
    local text = inspect.rank(cfg, topo, part, sh, sched, prog, 5)
    local function has(s) T.ok(text:find(s, 1, true), "report lacks: %s", s) end
    has("ep 0 of 2, expt-tp 1 of 2, expt-dp 1 of 2")
    has("experts 0-3 (global ids)")
    has("c_fc.weight [:, 64:128] of [64, 128]")
    has("c_proj.weight [64:128, :] of [128, 64]")
    has("expert grads expt-dp [1,5], scaled 1/(DP*CP) = 1/4 (expert buffer)")
    has("grads: dp-cp [1-7 step 2] + tp [4-5]")
    has("over ep [5,7] and expt-tp [4-5]")
    text = inspect.rank(cfg, topo, part, sh, sched, prog, 0)
    T.ok(not text:find("replicated; grads: not reduced", 1, true), "router reduced")
    -- a dense model has no expert section
    local c2, t2, p2, s2, q2, g2 = F.build({}, { tp = 2 })
    T.ok(not inspect.rank(c2, t2, p2, s2, q2, g2, 0):find("\nexperts:", 1, true), "dense model")
end)

-- -- Parameter counts and memory cover the experts --------------------------------------------

-- Elements of one rank from the formula: per layer, the replicated LayerNorms (4C), attention
-- (3C*C/TP + C*C/TP, with biases + 3C/TP + C), the router (E*C, with biases + E), and E/EP
-- experts of c_fc [C, F/ETP] and c_proj [F/ETP, C] (+ F/ETP and C with biases); the first
-- stage adds wte (Vp/TP rows) and wpe, the last ln_f (and the tied wte copy when PP > 1).
local function rank_numel(cfg, topo, part, r)
    local m, c = cfg.model, topology.coords(topo, r)
    local C, E, Fe = m.hidden, m.moe.experts, m.moe.ffn_hidden
    local TP, ETP = cfg.tp, cfg.etp
    local st = part.stages[c.pp + 1]
    local n = 0
    for _, ch in ipairs(st.chunks) do
        local per = 4 * C + 3 * C * C // TP + C * C // TP + E * C
        if m.bias then per = per + 3 * C // TP + C + E end
        local expert = C * Fe // ETP + Fe // ETP * C
        if m.moe.bias then expert = expert + Fe // ETP + C end
        n = n + ch.count * (per + E // cfg.ep * expert)
        if ch.embedding then n = n + cfg.vocab_padded // TP * C + m.seq_len * C end
        if ch.head then
            n = n + 2 * C
            if cfg.pp > 1 then n = n + cfg.vocab_padded // TP * C end
        end
    end
    return n
end

T.test("parameters and memory per rank include the experts", function()
    for _, case in ipairs({
        { tiny(), { tp = 4, pp = 2, sp = true, etp = 1, ep = 4 } },
        { tiny(), { tp = 2, dp = 4, sp = true, etp = 2, ep = 4, dist_opt = true } },
        { tiny({ bias = true }), { tp = 2, sp = true, dp = 2, ep = 2, etp = 1 } },
        { tiny(), { pp = 2, dp = 2, ep = 2, vp = 2, nmb = 2 } },
    }) do
        local cfg, topo, part, sh, sched, prog = F.build(case[1], case[2])
        local expert_sum = 0
        for r = 0, cfg.world - 1 do
            local cls = shards.class_of(sh, r)
            T.eq(cls.numel, rank_numel(cfg, topo, part, r), "elements of rank " .. r)
            -- docs/megatron.md §5.7: without the distributed optimizer, per element 4+4+8 (fp32), 2+2+16
            -- (fp16/bf16 with fp32 master and moments) bytes
            T.eq(shards.bytes_of(cls, "fp32", false).total, 16 * cls.numel, "fp32 bytes")
            T.eq(shards.bytes_of(cls, "fp16", false).total, 20 * cls.numel, "fp16 bytes")
            -- the expert buffer (EP > 1 or ETP != TP) holds exactly the expert elements, and
            -- with the distributed optimizer its state is sharded over expt-dp
            local held = 0
            for _, p in ipairs(cls.params) do
                if p.expert then held = held + p.numel end
            end
            for _, b in ipairs(cls.buffers) do
                if b.kind == "expert" then
                    T.ok(b.dp_shards == cfg.edp, "expert buffer shards over expt-dp")
                    held = held - b.numel
                end
            end
            T.eq(held, 0, "expert buffer elements of rank " .. r)
            -- one expert replica (expt-dp rank 0) covers each expert element exactly once
            local c = topology.coords(topo, r)
            if c.edp == 0 then
                for _, p in ipairs(cls.params) do
                    if p.expert and (p.tp_sharded or c.etp == 0) then
                        expert_sum = expert_sum + p.numel
                    end
                end
            end
        end
        T.eq(expert_sum, sh.unique_expert, "one expert replica holds every expert element")
    end
end)

T.done()
