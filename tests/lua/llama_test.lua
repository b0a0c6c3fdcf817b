-- tests/lua/llama_test.lua: the Llama family in the passes (docs/llama.md):
--   * the published models' exact parameter counts, and every llama model's count derived
--     from the formula (embeddings, attention with grouped-query k/v, SwiGLU or experts, norms);
--   * the tensors: Hugging Face names, shapes [out, in], their initialisation;
--   * tensor parallelism as Megatron splits it: q/k/v and gate/up by rows (their output
--     dimension), o/down by columns, embed_tokens and lm_head by vocabulary rows;
--   * the untied head needs no embedding group, the tied one does with PP > 1;
--   * the memory plan: RMSNorm keeps no means, the q|k|v projections and SwiGLU buffers.
-- Run: build/gen --lua tests/lua/llama_test.lua (tests/lua/suite.sh).

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
require("strict")
local T = require("harness")("llama")
local config = require("config")
local program = require("program")
local shards = require("shards")
local topology = require("topology")
local partition = require("partition")
local schedule = require("schedule")

-- cfg, topo, part, prog of a model file and sizes
local function build(name, opts)
    local cfg = config.configure(config.load_model(name), opts)
    local topo = topology.build(cfg)
    local part = partition.build(cfg, topo)
    local prog = program.build(cfg, topo, part, shards.build(cfg, topo, part),
                               schedule.build(cfg.pp, cfg.vp, cfg.nmb))
    return cfg, topo, part, prog
end

-- The formula: V*C per embedding (two when untied), per layer q (H*D*C), k and v (KV*D*C
-- each), o (C*H*D), two norms (2C), and the MLP: gate, up, down (3*C*F), or the router (E*C)
-- and E experts of 3*C*Fe; the final norm (C).
local function formula(m)
    local C, D = m.hidden, m.head_dim
    local layer = 2 * m.heads * D * C + 2 * m.kv_heads * D * C + 2 * C
    if m.moe then layer = layer + m.moe.experts * C + m.moe.experts * 3 * C * m.moe.ffn_hidden
    else layer = layer + 3 * C * m.ffn_hidden end
    return m.vocab * C * (m.tie_embeddings and 1 or 2) + m.layers * layer + C
end

local function unique(m)
    local n = 0
    for _, p in ipairs(shards.global_params(m)) do n = n + p.numel end
    return n
end

T.test("published parameter counts", function()
    local m8 = config.load_model("llama3_8b")
    T.eq(unique(m8), 8030261248, "Llama 3 8B: 8,030,261,248")
    local mx = config.load_model("mixtral_8x7b")
    T.eq(unique(mx), 46702792704, "Mixtral 8x7B: 46,702,792,704")
    local m70 = config.load_model("llama3_70b")
    T.eq(unique(m70), 70553706496, "Llama 3 70B: 70,553,706,496")
end)

T.test("every llama model's count is the formula's", function()
    for _, name in ipairs({ "tiny_llama", "tiny_mixtral", "llama3_8b", "llama3_70b",
                            "mixtral_8x7b" }) do
        local m = config.load_model(name)
        T.eq(unique(m), formula(m), name)
    end
end)

-- a layout's params on class (pp, tp) by name
local function params_of(name, opts, tp)
    local cfg = config.configure(config.load_model(name), opts)
    local part = partition.build(cfg, topology.build(cfg))
    local by = {}
    for _, p in ipairs(shards.class_params(cfg, part, { pp = 0, tp = tp, ep = 0, etp = 0 })) do
        by[p.name] = p
    end
    return by
end

T.test("tensors: Hugging Face names and [out, in] shapes", function()
    local by = params_of("tiny_llama", {}, 0)
    local want = {
        ["model.embed_tokens.weight"] = "256x64", ["lm_head.weight"] = "256x64",
        ["model.norm.weight"] = "64",
        ["model.layers.0.input_layernorm.weight"] = "64",
        ["model.layers.0.self_attn.q_proj.weight"] = "64x64",
        ["model.layers.0.self_attn.k_proj.weight"] = "32x64",
        ["model.layers.0.self_attn.v_proj.weight"] = "32x64",
        ["model.layers.0.self_attn.o_proj.weight"] = "64x64",
        ["model.layers.7.post_attention_layernorm.weight"] = "64",
        ["model.layers.7.mlp.gate_proj.weight"] = "128x64",
        ["model.layers.7.mlp.up_proj.weight"] = "128x64",
        ["model.layers.7.mlp.down_proj.weight"] = "64x128",
    }
    for name, shape in pairs(want) do
        T.ok(by[name], name .. " exists")
        if by[name] then T.eq(table.concat(by[name].shape, "x"), shape, name) end
    end
    local n = 0
    for _ in pairs(by) do n = n + 1 end
    T.eq(n, 3 + 8 * 9, "3 outside the layers, 9 per layer, no biases, no wpe")
end)

T.test("tensor parallelism: rows of q/k/v/gate/up, columns of o/down, vocabulary rows", function()
    local by = params_of("tiny_llama", { tp = 2 }, 1)
    local function piece(name) return by[name].pieces[1] end
    local q = piece("model.layers.0.self_attn.q_proj.weight")
    T.eq({ q.start[1], q.start[2], q.size[1], q.size[2] }, { 32, 0, 32, 64 },
         "q: heads 4..7 of tp rank 1, every input channel")
    local k = piece("model.layers.0.self_attn.k_proj.weight")
    T.eq({ k.start[1], k.size[1] }, { 16, 16 }, "k: kv heads 2..3 (of 4) on tp rank 1")
    local o = piece("model.layers.0.self_attn.o_proj.weight")
    T.eq({ o.start[1], o.start[2], o.size[1], o.size[2] }, { 0, 32, 64, 32 },
         "o: the input columns of its heads")
    local dn = piece("model.layers.0.mlp.down_proj.weight")
    T.eq({ dn.start[2], dn.size[2] }, { 64, 64 }, "down: columns 64..127")
    local up = piece("model.layers.0.mlp.up_proj.weight")
    T.eq({ up.start[1], up.size[1] }, { 64, 64 }, "up: rows 64..127")
    local lm = piece("lm_head.weight")
    T.eq({ lm.start[1], lm.size[1] }, { 128, 128 }, "lm_head: vocabulary rows 128..255")
    T.eq(by["model.norm.weight"].split, "none", "norms replicated")
end)

T.test("roles: initialisation as Megatron's (scaled output projections, norms 1)", function()
    local _, _, _, prog = build("tiny_llama", {})
    local std = {}
    for _, r in ipairs(prog.roles) do std[r.name] = { r.init, r.std, r.scope } end
    local out = 0.02 / math.sqrt(16)
    T.eq(std["model.layers.%d.self_attn.o_proj.weight"][2], out, "o_proj 0.02/sqrt(2L)")
    T.eq(std["model.layers.%d.mlp.down_proj.weight"][2], out, "down_proj 0.02/sqrt(2L)")
    T.eq(std["model.layers.%d.self_attn.q_proj.weight"][2], 0.02, "q_proj 0.02")
    T.eq(std["model.layers.%d.input_layernorm.weight"][1], "ONE", "norm weights 1")
    T.eq(std["lm_head.weight"][3], "AFTER", "lm_head after the layers")
    T.eq(std["model.embed_tokens.weight"][3], "BEFORE", "embed_tokens before")
end)

T.test("the embedding group: created for a tied head with PP > 1 only", function()
    local function embd(name, opts)
        local _, _, _, prog = build(name, opts)
        for _, g in ipairs(prog.groups) do
            if g.id == "EMBD" then return g.create end
        end
    end
    T.eq(embd("tiny_llama", { pp = 2 }), false, "untied lm_head: no embd group")
    T.eq(embd("tiny", { pp = 2 }), true, "GPT (tied): the embd group")
end)

T.test("the memory plan: RMSNorm keeps rstd only; compact grouped-query q|k|v; SwiGLU", function()
    local _, _, _, prog = build("tiny_llama", { tp = 2, mbs = 2 })
    local mem = {}
    for _, m in ipairs(prog.stages[1].mem) do mem[m.id] = m end
    local N = 2 * 64
    T.eq(mem.L_LN1_MEAN.how, "NONE", "no LayerNorm mean")
    T.eq(mem.L_LN1_RSTD.elems, N, "rstd per token")
    T.eq(mem.L_QKV.elems, N * (4 + 2 * 2) * 8, "q|k|v kept compact: 4 + 2*2 heads of 8")
    T.eq(mem.S_DQKV.elems, N * (4 + 2 * 2) * 8, "its gradient: the same columns")
    T.eq(mem.L_FC.elems, N * 2 * 64, "gate | up: 2 FF_LOCAL")
    T.eq(mem.L_GELU.elems, N * 64, "the SwiGLU output: FF_LOCAL")
    T.eq(mem.S_DACT.elems, N * 64, "d(SwiGLU output)")
    local _, _, _, gp = build("tiny", {})
    local gmem = {}
    for _, m in ipairs(gp.stages[1].mem) do
        gmem[m.id] = m
        if m.id == "S_DACT" then T.eq(m.how, "NONE", "GPT: no " .. m.id) end
    end
    T.eq(gmem.L_QKV.elems, 3 * gmem.L_ATTY.elems, "GPT: q|k|v of 3 C, every head its own k|v")
end)
