-- shards.lua: which piece of which parameter every rank holds, and what it costs.
-- shards.build(cfg, topo, part) -> Shards. Ranks that hold the same pieces (same pp stage, tp
-- rank and, for MoE, ep/etp rank) form a class; params are computed once per class and a rank's
-- class follows from its coordinates (shards.class_of), so the cost does not grow with DP.
-- Names are Hugging Face GPT-2's; weights are in HF's Conv1D layout [in, out]. Splits follow
-- Megatron's tensor parallelism (docs/megatron.md §4, §7, §8); byte counts follow §5.7
-- and the distributed-optimizer buffer layout (§5.1). Pure; called by driver.lua and tests.

local ir = require("ir")
local util = require("util")

local M = {}

-- ORDER DTYPES: bytes per parameter (docs/megatron.md §5.7). Optimizer state: fp32 main params
-- (unless params are fp32), fp32 main grads (only when grads are fp16/bf16), Adam m and v.
M.DTYPES = {
    { "fp16",      "fp16/bf16 params + grads", 2, 2, 16 },
    { "bf16-fp32", "bf16 params + fp32 grads", 2, 4, 12 },
    { "fp32",      "fp32 params + grads",      4, 4, 8 },
}

M.PARAM_ALIGN = 64          -- each param starts at a multiple of 64 elements (dist-opt layout)
M.BUCKET_ALIGN = 128        -- buckets end at a multiple of lcm(dp_shards, 128)

local function zeros(n)
    local z = {}
    for i = 1, n do z[i] = 0 end
    return z
end

-- A param record with the defaults of a replicated tensor; 'p' overrides.
local function param(p, ctx)
    p.local_shape = p.local_shape or util.copy(p.shape)
    p.pieces = p.pieces or { ir.Piece { start = zeros(#p.shape), size = util.copy(p.shape),
                                        at = zeros(#p.shape) } }
    p.numel = util.product(p.local_shape)
    p.split = p.split or "none"
    p.tp_sharded = p.split ~= "none"
    p.expert = p.expert or false
    p.tied = p.tied or false
    p.seq_parallel = p.seq_parallel or false
    p.shared_embedding = p.shared_embedding or false
    p.chunk = ctx.chunk
    local rank = p.expert and ctx.etp or ctx.tp
    p.tp_duplicate = not p.tp_sharded and rank > 0
    p.buffer = (p.expert and ctx.expert_parallel) and "expert" or "dense"
    local reduce = { p.buffer == "expert" and "expt-dp" or "dp-cp" }
    if ctx.sp and p.seq_parallel then reduce[#reduce + 1] = "tp" end
    if p.shared_embedding then reduce[#reduce + 1] = "embd" end
    p.reduce = reduce
    return ir.Param(p)
end

-- Column-parallel weight [in, out] (Megatron splits the output dimension): rank t of n holds
-- columns [t*out/n, (t+1)*out/n). 'parts' > 1 splits each of that many equal column blocks
-- the same way (fused q|k|v): pieces q_t, k_t, v_t side by side in the local tensor.
local function column(name, shape, n, t, parts)
    parts = parts or 1
    local cols = shape[#shape] // parts
    local w = cols // n
    local pieces = {}
    for j = 0, parts - 1 do
        if #shape == 2 then
            pieces[j + 1] = ir.Piece { start = { 0, j * cols + t * w }, size = { shape[1], w },
                                       at = { 0, j * w } }
        else
            pieces[j + 1] = ir.Piece { start = { j * cols + t * w }, size = { w }, at = { j * w } }
        end
    end
    local local_shape = util.copy(shape)
    local_shape[#shape] = w * parts
    return { name = name, shape = shape, local_shape = local_shape, pieces = pieces,
             split = "column" }
end

-- Row-parallel weight [in, out] (Megatron splits the input dimension): rows [t*in/n, ...).
local function row(name, shape, n, t)
    local h = shape[1] // n
    return { name = name, shape = shape, local_shape = { h, shape[2] },
             pieces = { ir.Piece { start = { t * h, 0 }, size = { h, shape[2] }, at = { 0, 0 } } },
             split = "row" }
end

-- Vocab-parallel embedding [V, C]: rank t holds padded rows [t*Vp/n, (t+1)*Vp/n); rows past V
-- are padding, held locally but covered by no piece.
local function vocab(name, V, Vp, C, n, t)
    local h = Vp // n
    local start = t * h
    local real = math.min(V, start + h) - start
    local pieces = {}
    if real > 0 then
        pieces[1] = ir.Piece { start = { start, 0 }, size = { real, C }, at = { 0, 0 } }
    end
    return { name = name, shape = { V, C }, local_shape = { h, C }, pieces = pieces,
             split = "vocab" }
end

-- Params of a Llama layer 'i' (arch llama): Hugging Face names and nn.Linear layout [out, in],
-- so a column-parallel weight splits its rows (split_rows) and a row-parallel one its columns
-- (split_cols). Megatron's order: input_layernorm, o_proj (linear_proj), q, k, v (linear_qkv,
-- kept as three tensors: q over heads/TP heads, k and v over kv_heads/TP), the MLP's norm, then
-- gate, up (linear_fc1's two halves) and down (linear_fc2), or the router and each local
-- expert's w1 (gate), w2 (down), w3 (up). No biases (docs/llama.md).
local function llama_layer_params(cfg, i, ctx, out)
    local m, T, t = cfg.model, cfg.tp, ctx.tp
    local C, D = m.hidden, m.head_dim
    local h = "model.layers." .. i .. "."
    local split_rows, split_cols = row, column
    local function add(p, role)
        p.role, p.layer = role, i
        out[#out + 1] = param(p, ctx)
    end
    local function linear(role, shape, split)
        add(split(h .. role, shape, T, t), role)
    end
    add({ name = h .. "input_layernorm.weight", shape = { C }, seq_parallel = true },
        "input_layernorm.weight")
    linear("self_attn.o_proj.weight", { C, m.heads * D }, split_cols)
    linear("self_attn.q_proj.weight", { m.heads * D, C }, split_rows)
    linear("self_attn.k_proj.weight", { m.kv_heads * D, C }, split_rows)
    linear("self_attn.v_proj.weight", { m.kv_heads * D, C }, split_rows)
    add({ name = h .. "post_attention_layernorm.weight", shape = { C }, seq_parallel = true },
        "post_attention_layernorm.weight")
    local moe = m.moe
    if not moe then
        local F = m.ffn_hidden
        linear("mlp.gate_proj.weight", { F, C }, split_rows)
        linear("mlp.up_proj.weight", { F, C }, split_rows)
        linear("mlp.down_proj.weight", { C, F }, split_cols)
        return
    end
    add({ name = h .. "block_sparse_moe.gate.weight", shape = { moe.experts, C },
          seq_parallel = true }, "block_sparse_moe.gate.weight")
    local Fe, Te, te = moe.ffn_hidden, cfg.etp, ctx.etp
    local nl = moe.experts // cfg.ep
    for x = ctx.ep * nl, ctx.ep * nl + nl - 1 do
        local e = h .. "block_sparse_moe.experts." .. x .. "."
        local function expert(role, shape, split)
            local p = split(e .. role, shape, Te, te)
            p.expert, p.expert_id = true, x
            add(p, "block_sparse_moe.experts." .. role)
        end
        expert("w1.weight", { Fe, C }, split_rows)
        expert("w2.weight", { C, Fe }, split_cols)
        expert("w3.weight", { Fe, C }, split_rows)
    end
    local Fs = moe.shared_expert_ffn            -- Qwen2-MoE's shared expert, over tp
    if Fs then
        linear("mlp.shared_expert.gate_proj.weight", { Fs, C }, split_rows)
        linear("mlp.shared_expert.up_proj.weight", { Fs, C }, split_rows)
        linear("mlp.shared_expert.down_proj.weight", { C, Fs }, split_cols)
    end
end

-- Params of layer 'i' in Megatron's named_parameters order (local spec): input_layernorm,
-- self_attention.linear_proj, self_attention.linear_qkv, pre_mlp_layernorm, then the MLP
-- (linear_fc1, linear_fc2) or the MoE layer (router, then each local expert's fc1, fc2, then
-- the shared expert's, as Megatron's MoELayer registers shared_experts after experts).
local function layer_params(cfg, i, ctx, out)
    local m, T, t = cfg.model, cfg.tp, ctx.tp
    local C = m.hidden
    local h = "h." .. i .. "."
    local function add(p, role)
        p.role, p.layer = role, i
        out[#out + 1] = param(p, ctx)
    end
    local function replicated(role, shape)      -- norms and row-parallel biases: SP-tagged
        add({ name = h .. role, shape = shape, seq_parallel = true }, role)
    end
    local function norm(which)
        replicated(which .. ".weight", { C })
        replicated(which .. ".bias", { C })
    end
    local b = m.bias                            -- add_bias_linear: every linear layer's bias
    norm("ln_1")
    add(row(h .. "attn.c_proj.weight", { C, C }, T, t), "attn.c_proj.weight")
    if b then replicated("attn.c_proj.bias", { C }) end
    add(column(h .. "attn.c_attn.weight", { C, 3 * C }, T, t, 3), "attn.c_attn.weight")
    if b then add(column(h .. "attn.c_attn.bias", { 3 * C }, T, t, 3), "attn.c_attn.bias") end
    norm("ln_2")
    local moe = m.moe
    if not moe then
        local F = m.ffn_hidden
        add(column(h .. "mlp.c_fc.weight", { C, F }, T, t), "mlp.c_fc.weight")
        if b then add(column(h .. "mlp.c_fc.bias", { F }, T, t), "mlp.c_fc.bias") end
        add(row(h .. "mlp.c_proj.weight", { F, C }, T, t), "mlp.c_proj.weight")
        if b then replicated("mlp.c_proj.bias", { C }) end
        return
    end
    replicated("mlp.router.weight", { moe.experts, C })
    if moe.bias then replicated("mlp.router.bias", { moe.experts }) end
    local Fe, Te, te = moe.ffn_hidden, cfg.etp, ctx.etp
    local nl = moe.experts // cfg.ep
    for x = ctx.ep * nl, ctx.ep * nl + nl - 1 do
        local e = h .. "mlp.experts." .. x .. "."
        local function expert(p, role)
            p.expert, p.expert_id = true, x
            add(p, "mlp.experts." .. role)
        end
        expert(column(e .. "c_fc.weight", { C, Fe }, Te, te), "c_fc.weight")
        if moe.bias then expert(column(e .. "c_fc.bias", { Fe }, Te, te), "c_fc.bias") end
        expert(row(e .. "c_proj.weight", { Fe, C }, Te, te), "c_proj.weight")
        if moe.bias then expert({ name = e .. "c_proj.bias", shape = { C } }, "c_proj.bias") end
    end
    local Fs = moe.shared_expert_ffn            -- the shared expert: the dense MLP's split
    if Fs then
        local s = "mlp.shared_experts."
        add(column(h .. s .. "c_fc.weight", { C, Fs }, T, t), s .. "c_fc.weight")
        if b then add(column(h .. s .. "c_fc.bias", { Fs }, T, t), s .. "c_fc.bias") end
        add(row(h .. s .. "c_proj.weight", { Fs, C }, T, t), s .. "c_proj.weight")
        if b then replicated(s .. "c_proj.bias", { C }) end
    end
end

-- Every param a rank of class 'cls' holds, chunk by chunk, in named_parameters order:
-- wte, wpe (stage 0, chunk 0), the chunk's layers, ln_f and the tied wte copy (last stage,
-- last chunk; the copy only when PP > 1, else the head reuses wte itself). Llama: embed_tokens,
-- the layers, model.norm and lm_head (untied), or the tied copy of embed_tokens as for GPT.
function M.class_params(cfg, part, cls)
    local m, P = cfg.model, cfg.pp
    local llama = m.arch == "llama"
    local layer = llama and llama_layer_params or layer_params
    local out = {}
    for _, chunk in ipairs(part.stages[cls.pp + 1].chunks) do
        local ctx = { chunk = chunk.vp, tp = cls.tp, ep = cls.ep, etp = cls.etp, sp = cfg.sp,
                      expert_parallel = cfg.ep > 1 or cfg.etp ~= cfg.tp }
        -- a vocabulary-parallel [V, C] tensor; with a tied head and PP > 1 both copies of the
        -- embedding are Megatron's shared_embedding
        local function vocab_param(name, role, tied)
            local p = vocab(name, m.vocab, cfg.vocab_padded, m.hidden, cfg.tp, cls.tp)
            p.role, p.tied = role, tied
            p.shared_embedding = m.tie_embeddings and P > 1
            return param(p, ctx)
        end
        local function norm(name, role)
            out[#out + 1] = param({ name = name, role = role, shape = { m.hidden },
                                    seq_parallel = true }, ctx)
        end
        local embed = llama and "model.embed_tokens.weight" or "wte.weight"
        local embed_role = llama and "embed_tokens.weight" or "wte.weight"
        if chunk.embedding then
            out[#out + 1] = vocab_param(embed, embed_role, false)
            if not llama then
                out[#out + 1] = param({ name = "wpe.weight", role = "wpe.weight",
                                        shape = { m.seq_len, m.hidden } }, ctx)
            end
        end
        for i = chunk.first, chunk.first + chunk.count - 1 do
            layer(cfg, i, ctx, out)
        end
        if chunk.head then
            if llama then
                norm("model.norm.weight", "norm.weight")
            else
                norm("ln_f.weight", "ln_f.weight")
                norm("ln_f.bias", "ln_f.bias")
            end
            if not m.tie_embeddings then
                out[#out + 1] = vocab_param("lm_head.weight", "lm_head.weight", false)
            elseif P > 1 then
                out[#out + 1] = vocab_param(embed, embed_role, true)
            end
        end
    end
    return out
end

-- The distributed optimizer's layout of one grad buffer (docs/megatron.md §5.1): params in
-- reverse order, each start rounded up to 64 elements, the shared embedding in a bucket of
-- its own, every bucket padded to a multiple of lcm(dp_shards, 128); a new bucket once one
-- holds bucket_size elements (nil: no size-based bucketing, Megatron's overlap_grad_reduce off,
-- and always on later pipeline stages and chunks).
function M.layout(params, chunk, kind, dp_shards, bucket_size)
    local align = util.lcm(dp_shards, M.BUCKET_ALIGN)
    local buckets, pos, numel, cur = {}, 0, 0, nil
    local function close()
        if cur then
            local stop = util.round_up(pos, align)
            cur.size = stop - cur.start
            cur.shard = cur.size // dp_shards
            buckets[#buckets + 1] = ir.Bucket(cur)
            pos, cur = stop, nil
        end
    end
    for i = #params, 1, -1 do
        local p = params[i]
        if p.shared_embedding then close() end
        cur = cur or { start = pos, slots = {} }
        local start = util.round_up(pos, M.PARAM_ALIGN)
        cur.slots[#cur.slots + 1] = ir.Slot { name = p.name, offset = start, numel = p.numel }
        pos, numel = start + p.numel, numel + p.numel
        if p.shared_embedding or (bucket_size and pos - cur.start >= bucket_size) then close() end
    end
    close()
    local shard = 0
    for _, b in ipairs(buckets) do shard = shard + b.shard end
    return ir.Buffer { chunk = chunk, kind = kind, dp_shards = dp_shards, numel = numel,
                       size = pos, shard = shard, buckets = buckets }
end

-- Buffers of one class: per chunk, the dense buffer then the expert buffer (if any). Only the
-- first chunk of pipeline stage 0 splits its buffers by size (docs/megatron.md §5.1).
local function buffers(cfg, params, pp)
    local out = {}
    local shards = { dense = cfg.dp * cfg.cp, expert = cfg.edp }
    for v = 0, cfg.vp - 1 do
        for _, kind in ipairs({ "dense", "expert" }) do
            local list = {}
            for _, p in ipairs(params) do
                if p.chunk == v and p.buffer == kind then list[#list + 1] = p end
            end
            local size = pp == 0 and v == 0 and cfg.bucket_size or nil
            if #list > 0 then out[#out + 1] = M.layout(list, v, kind, shards[kind], size) end
        end
    end
    return out
end

-- Bytes per dtype combination, without and with the distributed optimizer.
local function bytes(dtypes, numel, bufs)
    local size, shard = 0, 0
    for _, b in ipairs(bufs) do size, shard = size + b.size, shard + b.shard end
    local out = {}
    for _, dist in ipairs({ false, true }) do
        for _, d in ipairs(dtypes) do
            local n, s = dist and size or numel, dist and shard or numel
            local rec = { dtype = d.name, dist_opt = dist, params = n * d.param,
                          grads = n * d.grad, optim = s * d.optim }
            rec.total = rec.params + rec.grads + rec.optim
            out[#out + 1] = ir.Bytes(rec)
        end
    end
    return out
end

-- Every tensor of the model once, whole: the params of one rank holding everything
-- (TP, PP, EP 1, no vocab padding). Param records; for the unique counts and for tests.
function M.global_params(model)
    local cfg = { model = model, tp = 1, pp = 1, ep = 1, etp = 1, sp = false,
                  vocab_padded = model.vocab }
    local whole = { stages = { { chunks = { { vp = 0, first = 0, count = model.layers,
                                              embedding = true, head = true } } } } }
    return M.class_params(cfg, whole, { pp = 0, tp = 0, ep = 0, etp = 0 })
end

function M.build(cfg, topo, part)
    local W, has_moe = cfg.world, cfg.model.moe ~= nil
    local d, e = topo.dense, topo.expert
    local function axis(grid, name)
        for i, a in ipairs(grid.axes) do
            if a == name then return grid.strides[i], grid.sizes[i] end
        end
    end
    local spp, npp = axis(d, "pp")
    local stp, ntp = axis(d, "tp")
    local sep, nep = axis(e, "ep")
    local set, net = axis(e, "tp")

    -- Classes: the (pp, tp, ep, etp) coordinates that occur, numbered in order of their
    -- lowest rank, with how many ranks each has -- from the grids' structure, without
    -- visiting every rank: the (tp, ep, etp) part of a rank's key repeats every L ranks (L =
    -- lcm of those axes' stride * size); when pp's stride is a multiple of L (pp last in the
    -- order, as usual) pp is independent of it, so one period of L ranks gives every class of
    -- every stage; otherwise one period of lcm(L, pp stride * PP) is enumerated.
    local axes = { spp, npp, stp, ntp, sep, nep, set, net }
    local L = stp * ntp
    if has_moe then L = util.lcm(util.lcm(L, sep * nep), set * net) end
    local function key(r)
        local x, y = 0, 0
        if has_moe then x, y = (r // sep) % nep, (r // set) % net end
        return (r // spp) % npp, (r // stp) % ntp, x, y
    end
    local found = {}        -- key text -> {pp, tp, ep, etp, ranks, first}
    local function count(r, per)
        local pp, t, x, y = key(r)
        local k = pp .. "," .. t .. "," .. x .. "," .. y
        local c = found[k]
        if not c then
            c = { pp = pp, tp = t, ep = x, etp = y, ranks = 0, first = r }
            found[k] = c
        end
        c.ranks = c.ranks + per
        if r < c.first then c.first = r end
    end
    if spp % L == 0 then
        local per = W // (L * npp)
        for pp = 0, npp - 1 do
            for rho = 0, L - 1 do count(pp * spp + rho, per) end
        end
    else
        local period = util.lcm(L, spp * npp)
        for r = 0, period - 1 do count(r, W // period) end
    end
    local classes, keys = {}, {}
    for _, c in util.sortedpairs(found) do classes[#classes + 1] = c end
    table.sort(classes, function(a, b) return a.first < b.first end)
    for i, c in ipairs(classes) do
        c.id = i - 1
        keys[c.pp .. "," .. c.tp .. "," .. c.ep .. "," .. c.etp] = i - 1
    end

    local dtypes = {}
    for i, dt in ipairs(M.DTYPES) do
        dtypes[i] = ir.Dtype { name = dt[1], label = dt[2], param = dt[3], grad = dt[4],
                               optim = dt[5] }
    end
    local held = 0
    for i, c in ipairs(classes) do
        c.params = M.class_params(cfg, part, c)
        local numel = 0
        for _, p in ipairs(c.params) do numel = numel + p.numel end
        c.numel = numel
        c.buffers = buffers(cfg, c.params, c.pp)
        c.bytes = bytes(dtypes, numel, c.buffers)
        classes[i] = ir.Class(c)
        held = held + c.ranks * numel
    end

    local unique, unique_expert = 0, 0
    for _, p in ipairs(M.global_params(cfg.model)) do
        unique = unique + p.numel
        if p.expert then unique_expert = unique_expert + p.numel end
    end
    return ir.Shards { classes = classes, keys = keys, key_axes = axes, has_moe = has_moe,
                       dtypes = dtypes, unique = unique, unique_dense = unique - unique_expert,
                       unique_expert = unique_expert, held = held }
end

-- The class record of rank 'r': the one with r's (pp, tp, ep, etp) coordinates.
function M.class_of(sh, r)
    local a = sh.key_axes
    local x, y = 0, 0
    if sh.has_moe then x, y = (r // a[5]) % a[6], (r // a[7]) % a[8] end
    local k = (r // a[1]) % a[2] .. "," .. (r // a[3]) % a[4] .. "," .. x .. "," .. y
    return sh.classes[sh.keys[k] + 1]
end

-- The Bytes record of a class for dtype 'name' with or without the distributed optimizer.
function M.bytes_of(cls, name, dist_opt)
    for _, b in ipairs(cls.bytes) do
        if b.dtype == name and b.dist_opt == dist_opt then return b end
    end
end

return M
