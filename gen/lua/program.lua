-- program.lua: the training program of one output directory as a typed record (ir.lua
-- Program): every decision about the generated code, as numbers, enums and names, never C text.
-- emit.lua and templates/program/ only print it; the library (lib/) executes it.
--
-- program.build(cfg, topo, part, sh, sched) -> Program. Pure. For every pipeline stage it
-- decides the parameter buffers (Megatron's layout, from shards.lua), the tensor tables (one
-- layer's, factored out of every layer of a chunk, and the pieces as functions of the tp /
-- expert-tp coordinate, checked against every rank class), the activation slots (from the
-- schedule), the device memory plan (every buffer the library allocates), the unrolled schedule
-- with the collectives each call runs inside the library, and the step's tail (gradient
-- reductions, norm, optimizer, loss). Then it proves the program cannot hang: verify.lua
-- simulates every stage's complete list of communication, on MPI's and on NCCL's matching
-- rules, and a failure is raised with its counterexample. No I/O.

local diag = require("diag")
local ir = require("ir")
local layer = require("layer")
local overlap = require("overlap")
local schedule = require("schedule")
local shards = require("shards")
local tables = require("tables")
local topology = require("topology")
local util = require("util")
local verify = require("verify")

local M = {}

local function check_int(x, what)
    return util.check_int(x, "program: " .. what)
end

-- FNV-1a 64 of a string (the random stream of a tensor's values; the runtime computes the
-- same, rt_fnv1a64). Kept for reports and tests.
function M.fnv1a64(s)
    local h = 0xcbf29ce484222325
    for i = 1, #s do
        h = h ~ s:byte(i)
        h = h * 0x100000001b3          -- wraps modulo 2^64 like the C version
    end
    return h
end

-- -- Sizes --------------------------------------------------------------------------------------

-- The sizes of one micro-batch on one rank, as the library's gpt_dims holds them.
function M.sizes(cfg)
    local m, TP = cfg.model, cfg.tp
    local T, B, C = cfg.seq // cfg.cp, cfg.mbs, m.hidden     -- this rank's share of the sequence
    local N = T * B
    local s = {
        T = T, B = B, C = C, N = N, n_sp = cfg.sp and N // TP or N, tp = TP, seq = cfg.seq,
        t_chunk = cfg.cp > 1 and cfg.seq // (2 * cfg.cp) or T,
        heads_local = m.heads // TP, head_dim = C // m.heads, c_local = C // TP,
        v_local = cfg.vocab_padded // TP, nmb = cfg.nmb, llama = m.arch == "llama",
        kv_local = m.kv_heads // TP,
    }
    -- q|k|v: heads_local query heads and kv_local kv heads (grouped-query attention: the
    -- kernels map query head h to kv head h / (heads_local/kv_local); GPT: kv_local = heads_local)
    s.kv_c = s.kv_local * s.head_dim
    s.qkv_local = s.heads_local * s.head_dim + 2 * s.kv_c
    s.cp, s.ep, s.etp = cfg.cp, cfg.ep, cfg.etp
    -- CP_COMM=a2a: each cp rank attends HEADS_LOCAL/CP heads of the whole sequence
    s.cp_heads = s.heads_local // cfg.cp
    s.cp_hw = s.cp_heads * s.head_dim
    s.cp_kv = s.kv_local // cfg.cp             -- and KV_LOCAL/CP kv heads (config.lua checks)
    s.cp_kvw = s.cp_kv * s.head_dim
    s.act_size = cfg.bf16 and 2 or 4          -- bytes of one activation element
    local moe = m.moe
    -- the dense MLP's columns, or with experts the shared expert's (in the same buffers)
    s.shared = moe ~= nil and moe.shared_expert_ffn ~= nil
    s.ff_local = (s.shared and moe.shared_expert_ffn or m.ffn_hidden) // TP
    s.fc_local = s.llama and 2 * s.ff_local or s.ff_local       -- gate | up
    if moe then
        s.E, s.K = moe.experts, moe.top_k
        s.nl = moe.experts // cfg.ep
        s.eff_local = moe.ffn_hidden // cfg.etp
        s.efc_local = s.llama and 2 * s.eff_local or s.eff_local   -- w1 | w3
        -- the capacity per router call: this rank's n_sp tokens (Megatron's get_capacity of
        -- apply_router_token_dropping); none when it exceeds them, and padding then sends
        -- every token to every expert (Megatron's capacity mask is all ones)
        local cap = moe.capacity_factor and
                    math.ceil((s.n_sp * s.K / s.E) * moe.capacity_factor)
        s.capacity = (cap and cap <= s.n_sp) and cap or s.n_sp * s.K
        s.pad_rows = (cap and moe.pad_to_capacity) and math.min(cap, s.n_sp) or 0
        s.send_max = math.max(s.n_sp * s.K, s.E * s.pad_rows)
        s.recv_max = s.send_max * cfg.ep
        s.rows_max = s.recv_max * cfg.etp
        -- the aux loss's separate token sets: the micro-batch, or each of its B sequences
        s.aux_seqs = moe.load_balancing == "seq_aux_loss" and s.B or 1
        s.counts = (TP * cfg.cp + 1) * s.E * s.aux_seqs + (cfg.etp + 3) * cfg.ep * s.nl
    end
    return s
end

local FLT_MIN, FLT_MAX = 1.1754943508222875e-38, 3.4028234663852886e+38

local INT_MAX = 2147483647                  -- C's int, as gpt.h's fields hold the constants

-- Constant 'name' of 'kind' (ir.Const) into 'list'. An int must fit the C type it is emitted
-- as: 'ctype' "long long" (math.maxinteger), else int; a float a float. Derived constants are
-- added after the ones they are made of, so a product is checked before it can wrap around.
local function const(list, name, kind, value, comment, ctype)
    if kind == "int" then
        check_int(value, name)
        local max = ctype == "long long" and math.maxinteger or INT_MAX
        if value > max or value < -max - 1 then
            diag.error(nil, "%s = %d (%s) does not fit the C %s it is emitted as (at most " ..
                       "%d): lower the sizes it is made of", name, value, comment,
                       ctype or "int", max)
        end
    end
    -- a float the model's numbers make out of range would not compile, or be 0 or inf
    if kind == "float" and (value ~= value or math.abs(value) > FLT_MAX or
                            (value ~= 0 and math.abs(value) < FLT_MIN)) then
        diag.error(nil, "%s = %g (%s) does not fit a float (1.2e-38 to 3.4e+38, or 0): " ..
                   "change the model's coefficient", name, value, comment)
    end
    list[#list + 1] = ir.Const { name = name, kind = kind, value = value, comment = comment }
end

--[[
** The model FLOPs of one step as Megatron-LM counts them for its throughput and MFU
** (docs/megatron.md §13): every GEMM of the model, 2 FLOPs per multiply-add, 3 passes (the
** backward is twice the forward), full attention (the causal half is not taken off) and no
** recompute. Per token and layer: the q, k, v projections 2 C (C_Q + 2 KV_HEADS HEAD_DIM), the
** output projection 2 C_Q C, attention 2 * 2 SEQ C_Q (scores and values), the MLP 2 C F per
** matrix (2 matrices; 3 with SwiGLU; MoE: the top-k experts' and the shared expert's); per
** token the LM head 2 C V_PADDED. For GPT this is the known 72 B s l h^2 (1 + s/(6h) +
** V/(12 l h)).
]]
function M.model_flops(cfg, s)
    local layer, head = M.flops_per_token(cfg, s)
    local tokens = s.B * cfg.nmb * cfg.dp * s.seq
    return 3.0 * tokens * (cfg.model.layers * layer + head)
end

-- The forward FLOPs of one token in one layer, in the LM head, and of the layer's attention
-- core (scores and values), as model_flops counts them (the planner, plan.lua, prices each
-- stage's share).
function M.flops_per_token(cfg, s)
    local m = cfg.model
    local C, seq = m.hidden, s.seq
    local cq = m.heads * s.head_dim
    local ckv = (m.kv_heads or m.heads) * s.head_dim
    local mats = s.llama and 3 or 2
    local mlp = mats * 2 * C * m.ffn_hidden
    if m.moe then
        mlp = mats * 2 * C * m.moe.ffn_hidden * m.moe.top_k
        if m.moe.shared_expert_ffn then mlp = mlp + mats * 2 * C * m.moe.shared_expert_ffn end
    end
    local layer = 2 * C * (cq + 2 * ckv) + 2 * cq * C + 2 * 2 * seq * cq + mlp
    return layer, 2 * C * cfg.vocab_padded, 2 * 2 * seq * cq
end

-- Every number the program uses, named, with its origin (model.h).
local function consts(cfg, s, layout)
    local m, out = cfg.model, {}
    local function int(name, v, c) const(out, name, "int", v, c) end
    local function float(name, v, c) const(out, name, "float", v, c) end
    int("CFG_WORLD", cfg.world, "ranks = tp*cp*dp*pp")
    const(out, "CFG_LAYOUT", "str", layout, "for messages")
    int("CFG_TP", cfg.tp, "tensor-parallel size (TP)")
    int("CFG_PP", cfg.pp, "pipeline stages (PP)")
    int("CFG_DP", cfg.dp, "data-parallel size (DP)")
    int("CFG_CP", cfg.cp, "context-parallel size (CP)")
    int("CFG_VP", cfg.vp, "virtual chunks per stage (VP)")
    int("CFG_SP", cfg.sp and 1 or 0, "sequence parallelism (SP=1)")
    const(out, "CFG_ACT", "ident", cfg.bf16 and "RT_BF16" or "RT_F32",
          cfg.bf16 and "parameters, activations, their communication: bf16 (BF16=1)"
          or "parameters, activations, their communication: f32")
    int("CFG_ACT_SIZE", cfg.bf16 and 2 or 4, "bytes of one element of CFG_ACT")
    local rc = {}
    for _, mod in ipairs(cfg.recompute_modules) do rc[mod] = 1 end
    int("CFG_RC_ATTN", rc.core_attn or 0, "selective recompute of the attention core")
    int("CFG_RC_LN", rc.layernorm or 0, "selective recompute of the two LayerNorms")
    int("CFG_RC_MLP", rc.mlp or 0, "selective recompute of the dense MLP")
    int("CFG_B", s.B, "micro-batch size (MBS)")
    int("CFG_NMB", cfg.nmb, "micro-batches per step (NMB)")
    int("CFG_GBS", s.B * cfg.nmb * cfg.dp, "global batch = MBS*NMB*DP")
    int("CFG_SEQ", s.seq, "sequence length (SEQ)")
    int("CFG_T", s.T, cfg.cp > 1 and "positions per cp rank = SEQ/CP" or "positions per rank = SEQ")
    int("CFG_T_CHUNK", s.t_chunk, cfg.cp > 1 and "positions per load-balanced chunk = SEQ/(2*CP)"
        or "one chunk: the whole sequence")
    int("CFG_CP_A2A", cfg.cp_comm == "a2a" and 1 or 0,
        cfg.cp == 1 and "no context parallelism (CP = 1)"
        or cfg.cp_comm == "a2a" and "context-parallel attention: all-to-all (CP_COMM=a2a)"
        or "context-parallel attention: the p2p ring (CP_COMM=p2p)")
    if cfg.cp > 1 and cfg.cp_comm == "a2a" then
        int("CFG_CP_HEADS", s.cp_heads, "heads each cp rank attends to = HEADS_LOCAL/CP")
        int("CFG_CP_HW", s.cp_hw, "their channels = CP_HEADS*HEAD_DIM")
        if s.llama then
            int("CFG_CP_KV", s.cp_kv, "kv heads each cp rank attends with = KV_LOCAL/CP")
            int("CFG_CP_KVW", s.cp_kvw, "their channels = CP_KV*HEAD_DIM")
        end
    end
    int("CFG_T_MODEL", m.seq_len, "rows of wpe (model.seq_len)")
    int("CFG_C", s.C, "channels (model.hidden)")
    int("CFG_N", s.N, "tokens per micro-batch = T*B")
    int("CFG_N_SP", s.n_sp, cfg.sp and "tokens per tp rank under SP = N/TP"
        or "tokens held between layers (= N, no SP)")
    int("CFG_HEADS", m.heads, "attention heads (model.heads)")
    int("CFG_HEADS_LOCAL", s.heads_local, "heads per tp rank = heads/TP")
    int("CFG_HEAD_DIM", s.head_dim, "channels per head = C/heads")
    int("CFG_C_LOCAL", s.c_local, "attention channels per tp rank = C/TP")
    int("CFG_QKV_LOCAL", s.qkv_local, s.llama and
        "q|k|v columns per tp rank = (HEADS_LOCAL + 2*KV_LOCAL)*HEAD_DIM" or
        "q|k|v columns per tp rank = 3C/TP")
    if s.llama then
        int("CFG_LLAMA", 1, "Llama layer: RMSNorm, SwiGLU, rotary positions, no biases")
        int("CFG_KV_HEADS", m.kv_heads, "key/value heads (model.kv_heads)")
        int("CFG_KV_LOCAL", s.kv_local, "kv heads per tp rank = KV_HEADS/TP")
        int("CFG_KV_C", s.kv_c, "k (and v) columns per tp rank = KV_LOCAL*HEAD_DIM")
        float("CFG_ROPE_THETA", m.rope_theta, "rotary embedding base (model.rope_theta)")
    end
    int("CFG_FF", m.ffn_hidden, "MLP width (model.ffn_hidden)")
    if s.shared then
        int("CFG_SHARED_FF", m.moe.shared_expert_ffn,
            "shared expert width (model.moe.shared_expert_ffn)")
        int("CFG_FF_LOCAL", s.ff_local, "shared expert columns per tp rank = SHARED_FF/TP")
    else
        int("CFG_FF_LOCAL", s.ff_local, "MLP columns per tp rank = FF/TP")
    end
    int("CFG_V", m.vocab, "vocabulary (model.vocab)")
    int("CFG_V_PADDED", cfg.vocab_padded,
        string.format("vocabulary padded to a multiple of %d*TP", m.vocab_pad))
    int("CFG_V_LOCAL", s.v_local, "vocabulary rows per tp rank = V_PADDED/TP")
    int("CFG_LAYERS", m.layers, "transformer layers (model.layers)")
    float("CFG_LN_EPS", m.norm_eps, (s.llama and "RMSNorm" or "LayerNorm") ..
          " eps (model.norm_eps)")
    float("CFG_ATT_SCALE", 1 / math.sqrt(s.head_dim), "1/sqrt(head_dim)")
    float("CFG_DLOSS", 1 / (s.N * cfg.nmb), "d(step loss)/d(token loss) = 1/(N*NMB)")
    float("CFG_GRAD_SCALE", 1 / (cfg.dp * cfg.cp), "1/(DP*CP): data-parallel mean")
    const(out, "CFG_TOKENS_PER_STEP", "int", s.B * cfg.nmb * cfg.dp * s.seq, "GBS*SEQ",
          "long long")
    const(out, "CFG_MODEL_FLOPS", "double", M.model_flops(cfg, s),
          "model FLOPs of a step, as Megatron counts them (model_flops)")
    int("CFG_P2P_N", s.n_sp * s.C, "elements of one pipeline message = N_SP*C")
    local moe = m.moe
    if moe then
        int("CFG_EXPERTS", s.E, "experts per MoE layer (model.moe.experts)")
        int("CFG_TOPK", s.K, "experts per token (model.moe.top_k)")
        int("CFG_EP", cfg.ep, "expert-parallel size (EP)")
        int("CFG_ETP", cfg.etp, "expert tensor-parallel size (ETP)")
        int("CFG_EXPERTS_LOCAL", s.nl, "experts per EP rank = EXPERTS/EP")
        int("CFG_EFF", moe.ffn_hidden, "expert MLP width (model.moe.ffn_hidden)")
        int("CFG_EFF_LOCAL", s.eff_local, "expert columns per ETP rank")
        int("CFG_PRE_SOFTMAX", moe.pre_softmax and moe.score_function == "softmax" and 1 or 0,
            moe.score_function == "sigmoid" and
            "sigmoid scores (score_function): pre_softmax does not apply" or
            "1: softmax over all, then top-k; 0: softmax of the k")
        int("CFG_MOE_BIAS", moe.bias and 1 or 0, "router and expert biases (add_bias_linear)")
        if s.shared then
            int("CFG_SHARED_EXPERT", 1, "a shared expert in the dense MLP's params and buffers")
        end
        local lb = moe.load_balancing
        if lb == "seq_aux_loss" then
            float("CFG_AUX_SCALE", moe.aux_loss_coeff * s.E / (s.K * s.seq ^ 2 * s.B),
                  "coeff*E/(K*SEQ^2*B): aux = this * sum over (sequence, e) of scores * count")
        else
            float("CFG_AUX_SCALE", lb == "none" and 0.0 or
                  moe.aux_loss_coeff * s.E / (s.K * (s.B * s.seq) ^ 2), lb == "none" and
                  "load_balancing none: no aux loss" or
                  "coeff*E/(K*(B*SEQ)^2): aux = this * sum_e scores_e * count_e")
        end
        int("CFG_AUX_SEQS", s.aux_seqs, s.aux_seqs > 1 and
            "seq_aux_loss: an aux loss per sequence, B of them" or "one aux loss per micro-batch")
        int("CFG_GROUPS", moe.num_groups or 1,
            "expert groups of group-limited routing (num_groups; 1: none)")
        int("CFG_GROUP_TOPK", moe.group_topk or 1, "groups a token may use (group_topk)")
        int("CFG_EXPERT_BIAS", moe.expert_bias and 1 or 0,
            "1: aux-loss-free load balancing, an expert bias on the scores for the top-k")
        float("CFG_BIAS_RATE", moe.expert_bias and moe.bias_update_rate or 0.0,
              "the expert bias's step per optimizer step (bias_update_rate)")
        float("CFG_TOPK_SCALE", moe.topk_scaling_factor or 1.0,
              "factor of the chosen probabilities (topk_scaling_factor; 1: none)")
        float("CFG_Z_SCALE", moe.z_loss_coeff / (s.B * s.seq),
              "z_loss_coeff/(B*SEQ): z-loss = this * sum over the tokens of logsumexp^2")
        float("CFG_AUX_GRAD", cfg.cp / cfg.nmb, cfg.cp > 1 and
              "the aux loss's share of the objective, CP/NMB: a micro-batch's aux loss spans " ..
              "the cp ranks, whose gradients the dp-cp mean divides by CP" or
              "the aux loss's share of the objective: 1/NMB")
        int("CFG_CAPACITY", s.capacity, s.capacity < s.n_sp * s.K and
            "choices an expert keeps of this rank's = ceil(N_SP*TOPK/EXPERTS * capacity_factor)"
            or "no capacity limit: N_SP*TOPK")
        int("CFG_DROP_PROBS", moe.drop_policy == "probs" and 1 or 0,
            "beyond the capacity keep 1: the highest probabilities, 0: the earliest rows")
        int("CFG_PAD_ROWS", s.pad_rows,
            "rows per expert with pad_to_capacity = min(capacity, N_SP); 0: no padding")
        int("CFG_MOE_SEND_MAX", s.send_max,
            "rows this rank sends at most = max(N_SP*TOPK, EXPERTS*PAD_ROWS)")
        int("CFG_MOE_RECV_MAX", s.recv_max, "rows it receives at most = SEND_MAX*EP")
        int("CFG_MOE_ROWS_MAX", s.rows_max, "rows at its experts at most = RECV_MAX*ETP")
        int("CFG_MOE_COUNTS", s.counts, "ints of count exchanges")
    end
    return out
end

-- -- The model's tensors --------------------------------------------------------------------------

-- Hugging Face's order inside a block (module order): c_attn before c_proj. Megatron's
-- named_parameters order (shards.lua) has linear_proj first.
local HF_RANK = { ["attn.c_attn.weight"] = 1, ["attn.c_attn.bias"] = 2,
                  ["attn.c_proj.weight"] = 3, ["attn.c_proj.bias"] = 4,
                  ["self_attn.q_proj.weight"] = 1, ["self_attn.k_proj.weight"] = 2,
                  ["self_attn.v_proj.weight"] = 3, ["self_attn.o_proj.weight"] = 4 }

local function hf_order(params)
    local out, pending = {}, {}
    local function flush()
        table.sort(pending, function(a, b) return HF_RANK[a.role] < HF_RANK[b.role] end)
        for _, p in ipairs(pending) do out[#out + 1] = p end
        pending = {}
    end
    for _, p in ipairs(params) do
        if HF_RANK[p.role] then pending[#pending + 1] = p
        else flush(); out[#out + 1] = p end
    end
    flush()
    return out
end

-- The roles of the model's tensors in checkpoint order (Hugging Face GPT-2's: wte, wpe, each
-- block in module order, ln_f), with their initialisation: N(0, init_std), output projections
-- N(0, init_std/sqrt(2*layers)), biases 0, LayerNorm weights 1. Returns the Role list and a
-- map role name -> 0-based index.
local function roles(cfg)
    local m = cfg.model
    local out, index = {}, {}
    local out_std = m.init_std / math.sqrt(2.0 * m.layers)
    local after = { ["ln_f.weight"] = true, ["ln_f.bias"] = true, ["norm.weight"] = true,
                    ["lm_head.weight"] = true }
    for _, p in ipairs(hf_order(shards.global_params(m))) do
        local r = p.role
        if not index[r] then
            local scope = p.expert_id and "EXPERT" or p.layer and "LAYER"
                or after[r] and "AFTER" or "BEFORE"
            local first_layer = p.layer == nil or p.layer == 0
            local first_expert = p.expert_id == nil or p.expert_id == 0
            if first_layer and first_expert then
                local name = p.name
                if p.layer then
                    name = name:gsub("^h%.%d+%.", "h.%%d."):gsub("^model%.layers%.%d+%.",
                                                                "model.layers.%%d.")
                end
                if p.expert_id then name = name:gsub("%.experts%.%d+%.", ".experts.%%d.") end
                local init, std = "NORMAL", m.init_std
                if r == "mlp.router.bias" then init = "NORMAL"   -- Megatron: init_method
                elseif r:match("bias$") then init, std = "ZERO", 0.0
                elseif r:match("^ln_") or r:match("norm%.weight$") then init, std = "ONE", 0.0
                elseif r:match("c_proj%.weight$") or r:match("o_proj%.weight$") or
                       r:match("down_proj%.weight$") or r:match("w2%.weight$") then
                    std = out_std
                end
                index[r] = #out
                out[#out + 1] = ir.Role { name = name, scope = scope,
                                          rows = #p.shape == 2 and p.shape[1] or 1,
                                          cols = p.shape[#p.shape], ndim = #p.shape,
                                          init = init, std = std }
            end
        end
    end
    return out, index
end

-- -- Ranks and groups ----------------------------------------------------------------------------

local AXES = { "tp", "cp", "ep", "dp", "pp" }     -- ORDER GPT_AXIS (lib/gpt.h)

local function grid_axes(grid)
    local size, stride = {}, {}
    for i, a in ipairs(AXES) do size[i], stride[i] = 1, 1 end
    for i, a in ipairs(grid.axes) do
        for j, b in ipairs(AXES) do
            if a == b then size[j], stride[j] = grid.sizes[i], grid.strides[i] end
        end
    end
    return ir.GridAxes { size = size, stride = stride }
end

-- The communicators a program may use (ORDER GPT_GROUP, lib/gpt.h), when it creates each.
local function groups(cfg, topo)
    local moe = cfg.model.moe ~= nil
    local expert_buffer = moe and (cfg.ep > 1 or cfg.etp ~= cfg.tp)
    -- when each is created, and what for, by its id; the ids, kinds and order are the
    -- library's (lib/gpt_tables.h GPT_GROUPS)
    local use = {
        TP = { cfg.tp > 1, "the layers' collectives" },
        DPCP = { cfg.dp * cfg.cp > 1, "gradient reduction" },
        PP = { cfg.pp > 1, "neighbours" },
        EMBD = { cfg.pp > 1 and cfg.model.tie_embeddings,
                 "tied embedding gradients, first and last stage" },
        MP = { cfg.tp * cfg.pp > 1 and not cfg.dist_opt, "gradient norm" },
        EP = { moe and cfg.ep > 1, "token all-to-all" },
        ETP = { moe and cfg.etp > 1, "the experts' slices" },
        EDP = { expert_buffer and cfg.edp > 1, "expert gradient reduction" },
        TPEPPP = { expert_buffer and not cfg.dist_opt and cfg.etp * cfg.ep * cfg.pp > 1,
                   "gradient norm of the experts" },
        CP = { cfg.cp > 1 and cfg.cp_comm == "a2a", "CP_COMM=a2a's all-to-all" },
        TPCP = { moe and cfg.cp > 1, "the MoE aux loss's token counts" },
    }
    local want = {}
    for i, g in ipairs(tables.groups) do
        local u = assert(use[g.id], "program: no use for group " .. g.id)
        want[i] = { g.id, g.kind, u[1], u[2] }
    end
    local out = {}
    for _, w in ipairs(want) do
        local kind = topology.kind(topo, w[2])
        local axes, spans = {}, kind.grid == "pp"
        if kind.grid ~= "pp" then
            local grid = topo[kind.grid]
            for i, a in ipairs(grid.axes) do
                if kind.mask[i] and grid.sizes[i] > 1 then axes[#axes + 1] = a end
                if kind.mask[i] and a == "pp" and grid.sizes[i] > 1 then spans = true end
            end
        end
        out[#out + 1] = ir.Group {
            id = w[1], kind = w[2], size = kind.size, axes = axes, spans = spans,
            grid = kind.grid == "pp" and "EMBD" or kind.grid == "dense" and "DENSE" or "EXPERT",
            create = w[3] and kind.size > 1, comment = w[4],
            msizes = util.copy(kind.msizes), mstrides = util.copy(kind.mstrides),
        }
    end
    return out
end

-- -- Communication --------------------------------------------------------------------------

local function coll(op, group, n, dtype, red, n2)
    return ir.Coll { op = op, group = group, n = n, dtype = dtype or "f32", red = red, n2 = n2 }
end

local function append(list, items)
    for _, x in ipairs(items) do list[#list + 1] = x end
    return list
end

-- The dtype of the model's activations and parameters (docs/megatron.md §9.1): what the
-- tensor-parallel collectives and the pipeline messages carry.
local function act_dtype(cfg)
    return cfg.bf16 and "bf16" or "f32"
end

-- The code (layer.lua) behind each call of a chunk's forward and backward.
local CALL_CODE = { embedding_fwd = "embedding_fwd", embedding_bwd = "embedding_bwd",
                    layer_fwd = "layer_fwd", layer_recompute = "layer_fwd",
                    layer_bwd = "layer_bwd", head_fwd_bwd = "head" }

-- -- Activation recompute (docs/megatron.md §9.2) ------------------------------------------------

-- How each layer of a chunk of 'count' layers keeps its activations: per layer { work = -1
-- (in its activation slot) or the workspace position its recomputed buffers use, keep_out =
-- its output (res2) stays in the slot }, and the full-recompute groups { first, count } in
-- layer order (none for selective: those layers recompute inside their own backward).
function M.recompute_plan(cfg, count)
    local store, groups = {}, {}
    for j = 1, count do store[j] = { work = -1, keep_out = true } end
    if cfg.recompute == "selective" then
        for j = 1, count do store[j].work = 0 end
    elseif cfg.recompute == "full" then
        local n = cfg.recompute_layers
        if cfg.recompute_method == "uniform" then
            for first = 0, count - 1, n do
                groups[#groups + 1] = { first = first, count = math.min(n, count - first) }
            end
        else
            for j = 0, math.min(n, count) - 1 do groups[#groups + 1] = { first = j, count = 1 } end
        end
        for _, g in ipairs(groups) do
            for k = 0, g.count - 1 do
                store[g.first + k + 1] = { work = k, keep_out = k == g.count - 1 }
            end
        end
    end
    return store, groups
end

-- -- One stage: buffers, tensor tables, pieces -------------------------------------------------

-- gpt_field of each role: the list the library compiles (lib/gpt_tables.h GPT_FIELDS, read
-- through the module `tables`).
local FIELD = {}
for _, f in ipairs(tables.fields) do
    for _, role in ipairs(f.roles) do FIELD[role] = f.id end
end

-- The field of a role (nil for none).
function M.field_of(role) return FIELD[role] end

-- "layer 3", "layers 0..3", "layers 3..0" (backward), "no layers".
local function layers_text(ch, backward)
    if ch.count == 0 then return "no layers" end
    if ch.count == 1 then return "layer " .. ch.first end
    local a, b = ch.first, ch.first + ch.count - 1
    if backward then a, b = b, a end
    return string.format("layers %d..%d", a, b)
end

-- "embedding, layers 0..3 | layers 8..11, head + loss": what each chunk of a stage holds
-- ("embedding | ..." when a chunk holds no layers but the embedding or the head).
local function chunk_text(c, backward, head_text)
    local w = {}
    if c.embedding and not backward then w[#w + 1] = "embedding" end
    if c.count > 0 or not (c.embedding or c.head) then w[#w + 1] = layers_text(c, backward) end
    if c.head and head_text then w[#w + 1] = head_text end
    if c.embedding and backward then w[#w + 1] = "embedding" end
    return table.concat(w, ", ")
end

function M.stage_title(st)
    local parts = {}
    for _, c in ipairs(st.chunks) do parts[#parts + 1] = chunk_text(c, false, "head + loss") end
    return table.concat(parts, " | ")
end

-- The classes holding stage r, the reference one (tp, ep, etp all 0) first; they share one
-- local layout, which is checked.
local function stage_classes(sh, r)
    local list, ref = {}, nil
    for _, c in ipairs(sh.classes) do
        if c.pp == r then
            if c.tp == 0 and c.ep == 0 and c.etp == 0 then ref = c else list[#list + 1] = c end
        end
    end
    assert(ref, "program: no reference class for stage " .. r)
    table.insert(list, 1, ref)
    for t = 2, #list do
        assert(#list[t].params == #ref.params, "program: ranks of one stage differ in tensors")
        for bi, b in ipairs(ref.buffers) do
            local o = list[t].buffers[bi]
            assert(o.size == b.size and #o.buckets == #b.buckets and o.kind == b.kind,
                   "program: ranks of one stage differ in buffer layout")
        end
    end
    return list
end

-- Buffer index (0-based) and offset of every param of a class, by name.
local function placement(cls)
    local at = {}
    for bi, b in ipairs(cls.buffers) do
        for _, bk in ipairs(b.buckets) do
            for _, sl in ipairs(bk.slots) do at[sl.name] = { buf = bi - 1, offset = sl.offset } end
        end
    end
    return at
end

local function norm_class(p)
    if p.tied then return "NEVER" end
    if p.tp_sharded then return "ALWAYS" end
    return p.expert and "ETP0" or "TP0"
end

-- The split of a param's pieces: which coordinate moves them, and by how much per unit.
local function split_of(p)
    if p.split == "none" then return "NONE", 0, 0 end
    local axis = p.expert and "ETP" or "TP"
    if p.split == "row" or p.split == "vocab" then return axis, p.local_shape[1], 0 end
    -- column: every piece is one column block of the local width per part
    return axis, 0, p.pieces[1].size[#p.pieces[1].size]
end

-- A piece as the library's rectangle; 'vocab' pieces span the whole local rows (cut to the
-- vocabulary on each rank).
local function piece_rec(p, pc, param_row)
    local two = #p.shape == 2
    local split, step_row, step_col = split_of(p)
    local vocab = p.split == "vocab"
    return ir.ProgPiece {
        param = param_row, lrow = two and pc.at[1] or 0, lcol = pc.at[#pc.at],
        grow = two and pc.start[1] or 0, gcol = pc.start[#pc.start],
        rows = vocab and p.local_shape[1] or (two and pc.size[1] or 1), cols = pc.size[#pc.size],
        split = split, step_row = step_row, step_col = step_col,
        replicated = not p.tp_sharded, tied = p.tied, expert = p.expert, vocab = vocab,
    }
end

-- The pieces a class with coordinate 'coord' holds by the formula, as shards.lua writes them.
local function expand_piece(pr, coord, vocab_size)
    local grow, gcol = pr.grow + pr.step_row * coord, pr.gcol + pr.step_col * coord
    local rows = pr.rows
    if pr.vocab then rows = math.min(rows, vocab_size - grow) end
    if rows <= 0 or pr.cols <= 0 then return nil end
    return grow, gcol, rows
end

-- Check that the formulas reproduce every class's pieces (program.lua's contract with
-- lib/stage.c: a class's global ranges are an affine function of its tp / etp coordinate).
local function check_pieces(cfg, classes, pieces_of)
    local nl = cfg.model.moe and cfg.model.moe.experts // cfg.ep or 1
    for _, c in ipairs(classes) do
        for i, p in ipairs(c.params) do
            local ref = classes[1].params[i]
            assert(p.role == ref.role and util.shape(p.local_shape) == util.shape(ref.local_shape),
                   "program: class tensors differ at " .. p.name)
            if p.expert_id then
                assert(p.expert_id == ref.expert_id + c.ep * nl,
                       "program: expert ids of " .. p.name)
            end
            local want = {}
            for _, pr in ipairs(pieces_of[i] or {}) do
                local coord = pr.split == "TP" and c.tp or pr.split == "ETP" and c.etp or 0
                local grow, gcol, rows = expand_piece(pr, coord, cfg.model.vocab)
                if grow then want[#want + 1] = { grow, gcol, rows, pr } end
            end
            assert(#want == #p.pieces, string.format("program: %s: %d pieces on class %d, the " ..
                   "formula gives %d", p.name, #p.pieces, c.id, #want))
            for k, pc in ipairs(p.pieces) do
                local w, two = want[k], #p.shape == 2
                assert(w[1] == (two and pc.start[1] or 0) and w[2] == pc.start[#pc.start] and
                       w[3] == (two and pc.size[1] or 1) and w[4].cols == pc.size[#pc.size] and
                       w[4].lrow == (two and pc.at[1] or 0) and w[4].lcol == pc.at[#pc.at],
                       "program: piece formula disagrees with shards.lua for " .. p.name)
            end
        end
    end
end

local function param_rec(p, where, cls_roles, offset, nl)
    return ir.ProgParam {
        name = p.tied and "the head's copy of " .. p.name or p.name,
        field = p.tied and "HEAD_WTE" or assert(FIELD[p.role], "program: no field for " .. p.role),
        expert = p.expert_id and p.expert_id % nl or -1, buf = where.buf,
        decay = #p.shape == 2, sp_reduce = false, norm = norm_class(p),
        role = cls_roles[p.role], ld = p.local_shape[#p.local_shape], offset = offset,
        n = p.numel,
    }
end

-- The tensor tables of stage r: per chunk one layer's params (offsets from each layer's base)
-- and the bases; the other params (embedding, head) with absolute offsets; pieces of both.
local function tensor_tables(cfg, st, classes, role_index)
    local ref = classes[1]
    local at = placement(ref)
    local nl = cfg.model.moe and cfg.model.moe.experts // cfg.ep or 1
    local nbuf = #ref.buffers
    local chunks, others, other_pieces, pieces_of = {}, {}, {}, {}
    local index_of = {}
    for i, p in ipairs(ref.params) do index_of[p] = i end
    for _, ch in ipairs(st.chunks) do
        local by_layer = {}
        for j = 0, ch.count - 1 do by_layer[j] = {} end
        for _, p in ipairs(ref.params) do
            if p.layer and p.chunk == ch.vp then
                local l = by_layer[p.layer - ch.first]
                l[#l + 1] = p
            end
        end
        -- bases: each layer's smallest offset in each buffer
        local bases = {}
        for j = 0, ch.count - 1 do
            local b = {}
            for k = 1, nbuf do b[k] = -1 end
            for _, p in ipairs(by_layer[j]) do
                local w = at[p.name]
                if b[w.buf + 1] < 0 or w.offset < b[w.buf + 1] then b[w.buf + 1] = w.offset end
            end
            for k = 1, nbuf do if b[k] < 0 then b[k] = 0 end end
            bases[j + 1] = b
        end
        local rows, prows = {}, {}
        for r, p in ipairs(by_layer[0] or {}) do   -- none in a chunk without layers
            local w = at[p.name]
            rows[r] = param_rec(p, w, role_index, w.offset - bases[1][w.buf + 1], nl)
            for _, pc in ipairs(p.pieces) do prows[#prows + 1] = piece_rec(p, pc, r - 1) end
            pieces_of[index_of[p]] = {}
        end
        -- every layer has layer 0's tensors in the same buffers (checked) and its pieces (the
        -- library adds the layer to the tensor index); the same offsets from its bases but
        -- where a gradient bucket ends inside a layer (the bucket's padding): the shifts
        local shifts, shifted = {}, false
        for j = 0, ch.count - 1 do
            assert(#by_layer[j] == #rows, "program: layers of a chunk differ in tensors")
            shifts[j + 1] = {}
            for r, p in ipairs(by_layer[j]) do
                local w = at[p.name]
                assert(p.role == by_layer[0][r].role and w.buf == rows[r].buf,
                       "program: layer " .. p.layer .. " does not follow layer " .. ch.first)
                shifts[j + 1][r] = w.offset - bases[j + 1][w.buf + 1] - rows[r].offset
                shifted = shifted or shifts[j + 1][r] ~= 0
                local list = {}
                for _, pc in ipairs(p.pieces) do list[#list + 1] = piece_rec(p, pc, r - 1) end
                pieces_of[index_of[p]] = list
                for k, pr in ipairs(list) do     -- the same rectangles as layer 0's
                    local q = pieces_of[index_of[by_layer[0][r]]][k]
                    for _, f in ipairs({ "lrow", "lcol", "grow", "gcol", "rows", "cols" }) do
                        assert(pr[f] == q[f], "program: pieces of " .. p.name .. " differ")
                    end
                end
            end
        end
        chunks[#chunks + 1] = { params = rows, pieces = prows, bases = bases,
                                shifts = shifted and shifts or nil }
    end
    for _, p in ipairs(ref.params) do
        if not p.layer then
            local w = at[p.name]
            others[#others + 1] = param_rec(p, w, role_index, w.offset, nl)
            local list = {}
            for _, pc in ipairs(p.pieces) do
                local pr = piece_rec(p, pc, #others - 1)
                other_pieces[#other_pieces + 1] = pr
                list[#list + 1] = pr
            end
            pieces_of[index_of[p]] = list
        end
    end
    check_pieces(cfg, classes, pieces_of)
    -- sequence-parallel gradients are all-reduced over tp (docs/megatron.md §4.6)
    local sp_by_name = {}
    for _, p in ipairs(ref.params) do sp_by_name[p.name] = cfg.sp and p.seq_parallel end
    for _, c in ipairs(chunks) do
        for _, r in ipairs(c.params) do r.sp_reduce = sp_by_name[r.name] end
    end
    for _, r in ipairs(others) do r.sp_reduce = sp_by_name[r.name] end
    return chunks, others, other_pieces
end

-- -- One stage: memory plan -------------------------------------------------------------------

-- Every buffer of the memory plan as the library knows it (lib/gpt_tables.h GPT_MEMS, read
-- through the module `tables`): id, element type (A: the activations' dtype, f32 or bf16; F:
-- f32; I: i32), what (and what it is in a Llama layer, where that differs). L_ and ML_ entries
-- are one per layer and activation slot (or per recompute workspace position), C_ per chunk
-- slot, the rest one per stage.
local MEMS = {}
for i, m in ipairs(tables.mems) do
    MEMS[i] = { m.id, m.dtype, m.what, m.llama ~= "" and m.llama or nil }
end
M.MEMS = MEMS

-- Stage buffers that carry data between ranks (the rest are the layers' scratch).
local COMM = { MS_XS = true, MS_PS = true, MS_XR = true, MS_PR = true, MS_XG = true,
               MS_PG = true, MS_YR = true, MS_YS = true, MS_DPR = true, MS_DPS = true,
               MS_COUNTS = true, X_SP_PACK = true, S_RING_KV = true, S_RING_DKV = true,
               S_A2A_SEND = true, S_A2A_RECV = true }

-- The per-layer buffers each selective recompute module drops (docs/megatron.md §9.2): the
-- layer's backward computes them again.
local RECOMPUTED = { core_attn = { "L_ATTY", "L_LSE", "L_QKV_SEQ", "L_ATTY_SEQ" },
                     layernorm = { "L_LN1", "L_LN2" },
                     mlp = { "L_FC", "L_GELU" } }

-- Bytes the CUDA runtime allocates for itself at start (runtime/rt.h): cuBLAS's workspace
-- (RT_CUDA_WORKSPACE_BYTES, so that cuBLAS never allocates behind the plan) and the f32
-- staging of GEMMs with f32 inputs and a bf16 result (RT_CUDA_STAGE_BYTES).
M.CUDA_WORKSPACE_BYTES = 32 << 20
M.CUDA_STAGE_BYTES = 4 << 20

-- Whether per-layer entry 'id' lives in the recompute workspace for a layer stored as 'st'
-- (LayerStore), given the set of recomputed ids.
local function in_work(id, st, recomputed)
    return st.work >= 0 and recomputed[id] and not (id == "L_RES2" and st.keep_out)
end

-- The device memory of stage r as the library allocates it (lib/stage.c lib_stage_setup):
-- returns the Mem list (ORDER GPT_MEM), the bytes of one activation slot per chunk, the
-- parameter buffers' bytes (a MemParams), the total, and the bytes of one slot of the pool.
-- 'nparams': local tensors; 'sp_total': elements of the sequence-parallel gradients. 'pool':
-- nil, every chunk's slots its own; else the number of slots the chunks share (every chunk
-- has that many): slot k of every chunk is the same memory, a per-layer buffer shared by the
-- chunks' layers at the same position (lib/stage.c slot_mem), so one slot of the pool holds
-- the input, the tokens where the stage embeds, and at each layer position the
-- buffers some chunk keeps there.
local function memory_plan(cfg, s, chunks, head, nparams, sp_total, buffers, pool, ngrad)
    local moe = cfg.model.moe ~= nil
    local embedding = chunks[1].embedding
    local lse = s.B * s.heads_local * s.T
    local function m1(x) return math.max(x, 1) end     -- moe.c allocates at least one
    local ln = not s.llama      -- LayerNorm keeps its means; RMSNorm only rstd
    local dense = not moe or s.shared       -- the dense MLP's buffers (or the shared expert's)
    local size = {
        L_LN1 = s.n_sp * s.C, L_LN1_MEAN = ln and s.n_sp, L_LN1_RSTD = s.n_sp,
        L_QKV = s.N * s.qkv_local, L_LSE = lse, L_ATTY = s.N * s.c_local, L_RES1 = s.n_sp * s.C,
        L_LN2 = s.n_sp * s.C, L_LN2_MEAN = ln and s.n_sp, L_LN2_RSTD = s.n_sp,
        L_FC = dense and s.N * s.fc_local, L_GELU = dense and s.N * s.ff_local,
        L_RES2 = s.n_sp * s.C,
        C_X = s.n_sp * s.C, C_DY = s.n_sp * s.C, C_TOKENS = embedding and s.N,
        H_LNF = head and s.n_sp * s.C, H_LNF_MEAN = head and ln and s.n_sp,
        H_LNF_RSTD = head and s.n_sp,
        S_FULL = s.N * s.C, S_FULL_SP = cfg.sp and s.n_sp * s.C or "S_FULL",
        S_GATHER = cfg.sp and s.N * s.C, S_DQKV = s.N * s.qkv_local,
        S_DATTY = s.N * s.c_local, S_DSUM = lse, S_DFC = dense and s.N * s.fc_local,
        S_DACT = s.llama and dense and s.N * s.ff_local,
        S_DSHARED = s.shared and s.n_sp * s.C,
        S_LOGITS = head and s.N * s.v_local, S_CE = head and 4 * s.N, S_TARGETS = head and s.N,
        X_LOSS = s.nmb, X_STAT = nparams + 3, X_SP_PACK = sp_total > 0 and sp_total,
    }
    if cfg.cp > 1 and cfg.cp_comm == "p2p" then     -- layer.lua: the ring
        size.S_RING_KV = 2 * s.N * 2 * s.kv_c
        size.S_RING_DKV = 2 * s.N * 2 * s.kv_c
        size.S_RING_ACC = s.N * s.c_local
    elseif cfg.cp > 1 then                          -- layer.lua: the all-to-all
        size.L_QKV_SEQ, size.L_ATTY_SEQ = s.N * s.qkv_local, s.N * s.c_local
        size.S_A2A_SEND, size.S_A2A_RECV = s.N * s.qkv_local, s.N * s.qkv_local
        size.S_A2A_DOUT = s.N * s.c_local
    end
    if moe then
        local E, K, C = s.E, s.K, s.C
        for k, v in pairs({
            ML_SCORES = s.n_sp * E, ML_PROB = s.n_sp * K, ML_SEL = s.n_sp * K, ML_POS = s.n_sp * K,
            ML_SEND_TOK = s.send_max, ML_ORDER = s.rows_max, ML_UNORDER = s.rows_max,
            ML_XE = s.rows_max * C, ML_PE = s.rows_max, ML_FC = s.rows_max * s.efc_local,
            ML_H = s.rows_max * s.eff_local, ML_AUXG = E * s.aux_seqs,
            ML_ZG = cfg.model.moe.z_loss_coeff > 0 and s.n_sp or nil,
            ML_SSUM = cfg.model.moe.score_function == "sigmoid" and s.n_sp or nil,
            MS_LOGITS = s.n_sp * E, MS_XS = s.send_max * C, MS_PS = s.send_max,
            MS_XR = s.recv_max * C, MS_PR = s.recv_max, MS_XG = s.rows_max * C,
            MS_PG = s.rows_max, MS_ACT = s.rows_max * s.eff_local, MS_YE = s.rows_max * C,
            MS_DFC = s.llama and s.rows_max * s.efc_local or nil,
            MS_YG = s.rows_max * C, MS_YR = s.recv_max * C, MS_YS = s.send_max * C,
            MS_DPE = s.rows_max, MS_DPG = s.rows_max, MS_DPR = s.recv_max, MS_DPS = s.send_max,
            MS_DPROB = s.n_sp * K, MS_DLOGITS = s.n_sp * E, MS_COLSUM = E * s.aux_seqs,
            MS_COUNTS = s.counts,
        }) do size[k] = m1(v) end
    end
    local abytes = cfg.bf16 and 2 or 4
    local function esize(kind) return kind == "A" and abytes or 4 end

    -- what recompute moves to the workspace (docs/megatron.md §9.2)
    local recomputed = {}
    if cfg.recompute == "full" then
        for _, m in ipairs(MEMS) do
            if m[1]:match("^L_") or m[1]:match("^ML_") then recomputed[m[1]] = true end
        end
    else
        for _, mod in ipairs(cfg.recompute_modules) do
            for _, id in ipairs(RECOMPUTED[mod]) do recomputed[id] = true end
        end
    end

    -- the layer positions at which some chunk keeps per-layer entry 'id' in its slot (with a
    -- pool, each is one instance per pool slot, shared by the chunks)
    local function kept_positions(id)
        local kept, n = {}, 0
        for _, c in ipairs(chunks) do
            for j, st in ipairs(c.store) do
                if not in_work(id, st, recomputed) and not kept[j] then kept[j], n = true, n + 1 end
            end
        end
        return n
    end

    -- instances: per layer and slot where the layer keeps it, per workspace position used;
    -- per chunk slot (tokens: the embedding chunk's); else one
    local function instances(id)
        local per_layer = id:match("^L_") or id:match("^ML_")
        if per_layer then
            local slot, used = pool and pool * kept_positions(id) or 0, {}
            for _, c in ipairs(chunks) do
                for _, st in ipairs(c.store) do
                    if in_work(id, st, recomputed) then used[st.work] = true
                    elseif not pool then slot = slot + c.slots end
                end
            end
            local work = 0
            for _ in pairs(used) do work = work + 1 end
            return slot, work
        end
        if id == "C_TOKENS" then return chunks[1].slots, 0 end
        if id == "C_DY" then return ngrad, 0 end
        if id:match("^C_") then
            if pool then return pool, 0 end
            local n = 0
            for _, c in ipairs(chunks) do n = n + c.slots end
            return n, 0
        end
        return 1, 0
    end

    local list, total = {}, 0
    for _, m in ipairs(MEMS) do
        local id, v, what = m[1], size[m[1]], s.llama and m[4] or m[3]
        local category = (id:match("^L_") or id:match("^ML_") or id:match("^C_"))
            and "activations" or COMM[id] and "communication" or "workspace"
        local rec
        if type(v) == "string" then
            rec = ir.Mem { id = id, how = "ALIAS", alias = v, dtype = m[2], elems = 0,
                           instance = 0, count = 0, work = 0, bytes = 0, work_bytes = 0,
                           category = category, what = what }
        elseif v then
            check_int(v, id)
            local slot, work = instances(id)
            local one = v * esize(m[2])
            rec = ir.Mem { id = id, how = "ALLOC", dtype = m[2], elems = v, instance = one,
                           count = slot, work = work, bytes = one * (slot + work),
                           work_bytes = one * work, category = category, what = what }
        else
            rec = ir.Mem { id = id, how = "NONE", dtype = m[2], elems = 0, instance = 0,
                           count = 0, work = 0, bytes = 0, work_bytes = 0,
                           category = category, what = what }
        end
        total = total + rec.bytes
        list[#list + 1] = rec
    end

    -- one activation slot of each chunk: its input, gradient, tokens, the layers' buffers
    local slot_bytes = {}
    for i, c in ipairs(chunks) do
        local b = size.C_X * abytes + (c.embedding and 4 * s.N or 0)
        for _, m in ipairs(MEMS) do
            local id, v = m[1], size[m[1]]
            if (id:match("^L_") or id:match("^ML_")) and type(v) == "number" then
                for _, st in ipairs(c.store) do
                    if not in_work(id, st, recomputed) then b = b + v * esize(m[2]) end
                end
            end
        end
        slot_bytes[i] = b
    end
    local pool_bytes = 0
    if pool then
        pool_bytes = size.C_X * abytes + (embedding and 4 * s.N or 0)
        for _, m in ipairs(MEMS) do
            local id, v = m[1], size[m[1]]
            if (id:match("^L_") or id:match("^ML_")) and type(v) == "number" then
                pool_bytes = pool_bytes + kept_positions(id) * v * esize(m[2])
            end
        end
    end

    -- the parameter buffers: model parameters (activation dtype), f32 main gradients, the
    -- f32 main parameters of bf16 training and the two AdamW moments (the shard with the
    -- distributed optimizer; docs/megatron.md §5.7, §9.1)
    local pb = { params = 0, main = 0, grads = 0, moments = 0 }
    for _, b in ipairs(buffers) do
        pb.params = pb.params + abytes * b.size
        pb.grads = pb.grads + 4 * b.size
        pb.main = pb.main + (cfg.bf16 and 4 * b.state or 0)
        pb.moments = pb.moments + 8 * b.state
    end
    local param_bytes = pb.params + pb.main + pb.grads + pb.moments
    return list, slot_bytes, ir.MemParams(pb), param_bytes + total, pool_bytes
end

-- -- One stage: the unrolled schedule and the step's tail ----------------------------------------

local HEADER = { warmup = "warm-up: forward passes only",
                 steady = "steady state: one forward, one backward",
                 cooldown = "cool-down: backward passes only" }

-- The schedule of stage r as Ops: F and B with the library calls and their collectives, X
-- with the messages, SECTION markers between phases.
local function schedule_ops(cfg, s, lp, st, stage_sched, slots, dys, r)
    local P = cfg.pp
    local ops, phase = {}, nil
    local function slot(mb, c) return slots.slot[mb .. "." .. c] end
    local function grad(mb, c) return dys.dy[mb .. "." .. c] end
    for _, step in ipairs(stage_sched.steps) do
        if step.phase ~= phase then
            phase = step.phase
            ops[#ops + 1] = ir.Op { kind = "SECTION", text = HEADER[phase], comm = {} }
        end
        if step.kind == "F" or step.kind == "B" then
            local ch = st.chunks[step.chunk + 1]
            local fwd = step.kind == "F"
            local calls = {}
            local function add(op, j)
                calls[#calls + 1] = ir.Call { op = op, layer = j, global = j and ch.first + j,
                                              comm = lp[CALL_CODE[op]].comm }
            end
            local what = chunk_text(ch, not fwd, fwd and "head + loss (and its backward)")
            if ch.count == 0 and not (ch.embedding or (ch.head and fwd)) then
                what = fwd and "no layers (its input is its output)"
                    or "no layers (its output's gradient is its input's)"
            end
            if fwd then
                if ch.embedding then add("embedding_fwd") end
                for j = 0, ch.count - 1 do add("layer_fwd", j) end
                if ch.head then add("head_fwd_bwd") end
            else
                -- full recompute: each group's forward again, then its backward
                local _, groups = M.recompute_plan(cfg, ch.count)
                local group_of = {}
                for _, g in ipairs(groups) do group_of[g.first + g.count - 1] = g end
                for j = ch.count - 1, 0, -1 do
                    local g = group_of[j]
                    if g then
                        for k = g.first, g.first + g.count - 1 do add("layer_recompute", k) end
                    end
                    add("layer_bwd", j)
                end
                if ch.embedding then add("embedding_bwd") end
            end
            local comm = {}
            for _, c in ipairs(calls) do append(comm, c.comm) end
            local sl = slot(step.mb, step.chunk)
            ops[#ops + 1] = ir.Op {
                kind = step.kind, mb = step.mb, chunk = step.chunk, slot = sl,
                dy = grad(step.mb, step.chunk) or -1, calls = calls,
                comm = comm, text = string.format("%s mb %d, chunk %d (slot %d): %s",
                                                  fwd and "forward " or "backward", step.mb,
                                                  step.chunk, sl, what),
            }
        else
            local list, texts = {}, {}
            for _, e in ipairs(step.ops) do
                local peer = schedule.peer(P, r, e.dir)
                list[#list + 1] = ir.P2P {
                    send = e.send, what = e.what, mb = e.mb, chunk = e.chunk,
                    slot = e.what == "act" and slot(e.mb, e.chunk) or grad(e.mb, e.chunk),
                    dir = e.dir, peer = peer,
                    tag = e.what == "act" and "ACT" or "GRAD", n = s.n_sp * s.C,
                    dtype = act_dtype(cfg),
                }
                texts[#texts + 1] = string.format("%s %s mb %d (chunk %d) %s stage %d",
                    e.send and ">>> send" or "<<< recv",
                    e.what == "act" and "activations" or "gradient", e.mb, e.chunk,
                    e.send and "to" or "from", peer)
            end
            -- with overlap, a row that only sends activations completes them during the
            -- computation after it (waited before the next row's messages); not with CP > 1,
            -- whose ring shares the world communicator (NCCL runs its operations in order)
            local sends_only = cfg.overlap and cfg.cp == 1
            for _, m in ipairs(list) do sends_only = sends_only and m.send and m.what == "act" end
            ops[#ops + 1] = ir.Op { kind = "X", p2p = list, comm = {}, async = sends_only,
                                    text = table.concat(texts, ";  ") }
        end
    end
    -- ... and only when a computation follows it (the row of a forward or backward)
    for i, o in ipairs(ops) do
        if o.async and not (ops[i + 1] and (ops[i + 1].kind == "F" or ops[i + 1].kind == "B")) then
            o.async = false
        end
    end
    return ops
end

-- The step of stage r around its schedule (lib/stage.c), in order: Megatron's
-- finalize_model_grads (docs/megatron.md §5.6), the gradient norm (§6), clipping and AdamW
-- (§5.4 with the distributed optimizer), the loss. Each Op holds the statements the step
-- runs for it (layer.lua Stmt: library calls and the collectives themselves) and their
-- collectives (comm).
local function tail_ops(cfg, s, buffers, embd, sp_total, nsp, groups_by_id, nlayers, plan)
    local A = layer.arg
    local ops = {}
    local function op(kind, text, fields, body)
        fields = fields or {}
        fields.kind, fields.text = kind, text
        local b = layer.builder()
        if body then body(b) end
        fields.stmts = b.stmts
        fields.comm = layer.comm(b.stmts)
        ops[#ops + 1] = ir.Op(fields)
    end
    local function n(v) return A.int(A.E(s, v)) end
    local function on(id) return groups_by_id[id].create end
    local GRAD = function(b) return A.lit(string.format("gpt_grad_buf(%d)", b)) end
    local function grad_at(b, off)      -- buffer b's gradients from element off
        if off == 0 then return GRAD(b) end
        return A.lit(string.format("gpt_grad_buf(%d) + %d", b, off))
    end
    op("BEGIN", "zero the gradients", nil, function(b) b.k("gpt_step_begin", A.ident("in")) end)
    op("SCHEDULE", "the pipeline schedule (run_schedule above)", nil,
       function(b) b.k("run_schedule") end)
    -- the data-parallel reductions (docs/megatron.md §5.3): waited here in the order they
    -- started inside the schedule, or (no overlap) started and waited here
    local nred = #plan.reduce
    if nred > 0 and cfg.overlap then
        op("DP_WAIT", string.format("wait for the data-parallel reductions the schedule " ..
           "started (req[0..%d], in start order)", nred - 1), nil,
           function(b) b.wait_req(0, nred) end)
    elseif nred > 0 then
        op("DP_REDUCE", "each gradient bucket scaled by 1/(DP*CP), then reduced over its " ..
           "data-parallel group (grad_reduce_start); then waited", nil, function(b)
               for _, a in ipairs(plan.reduce) do
                   for _, st in ipairs(a.stmts) do b.stmts[#b.stmts + 1] = st end
               end
               b.wait_req(0, nred)
           end)
    end
    for _, so in ipairs(plan.scale_only) do
        op("GRAD_SCALE", string.format("buffer %d, bucket at %d: scale by 1/(DP*CP), the " ..
           "data-parallel mean (experts too: their gradients hold the tokens of every replica)",
           so.buf, so.bucket.start), { buf = so.buf, scale = 1 / (cfg.dp * cfg.cp) }, function(b)
               b.k("scale_inplace", grad_at(so.buf, so.bucket.start), n(so.bucket.size),
                   A.num("CFG_GRAD_SCALE"))
           end)
    end
    if sp_total > 0 and on("TP") then
        op("SP_ALLREDUCE", string.format("the gradients of the %d sequence-parallel tensors, " ..
           "packed (%s elements; docs/megatron.md §4.6)", nsp, util.thousands(sp_total)),
           { group = "TP", n = sp_total }, function(b)
               b.k("gpt_sp_pack")
               b.coll("allreduce", "tp", { n = sp_total, n_expr = A.E(s, sp_total),
                      dtype = "f32", red = "sum", send = A.mem("X_SP_PACK"),
                      text = ">>> all-reduce over tp: each tp rank saw its own tokens " ..
                             "(docs/megatron.md §4.6)" })
               b.k("gpt_sp_unpack")
           end)
    end
    if embd and on("EMBD") then
        op("EMBD_ALLREDUCE", "both copies of wte get the sum of the embedding's and the " ..
           "head's gradients (docs/megatron.md §7)",
           { group = "EMBD", buf = embd.buf, offset = embd.offset, n = embd.n }, function(b)
               b.coll("allreduce", "embd", { n = embd.n, n_expr = A.E(s, embd.n), dtype = "f32",
                      red = "sum", send = grad_at(embd.buf, embd.offset),
                      text = ">>> all-reduce over embd (first and last stage): wte's gradient " ..
                             "(docs/megatron.md §7)" })
           end)
    end
    op("NORM_LOCAL", "gradient norm (docs/megatron.md §6): this rank's sums of squares, " ..
       "every tensor counted once", nil, function(b) b.k("gpt_norm_local") end)
    local function norm_sum(kind, group, which, text)
        op("NORM_ALLREDUCE", text, { group = group, which = which }, function(b)
            b.coll("allreduce", kind, { n = 1, n_expr = A.E(s, 1), dtype = "f32", red = "sum",
                   send = A.lit(string.format("gpt_stat(%d)", which)),
                   text = ">>> all-reduce over " .. (kind == "world" and "the world" or kind) ..
                          ": " .. text })
        end)
    end
    if cfg.dist_opt then
        norm_sum("world", "WORLD", 2, "every rank holds a distinct shard")
    else
        if on("MP") then
            norm_sum("mp", "MP", 0, "every stage and tp shard of this model replica (tp-pp)")
        end
        if on("TPEPPP") then norm_sum("tp-ep-pp", "TPEPPP", 1, "every expert of this replica") end
    end
    op("NORM", "the norm: sqrt of the reduced sums", { which = cfg.dist_opt and 1 or 0 },
       function(b) b.k("gpt_norm_set", A.ident("out"), n(cfg.dist_opt and 1 or 0)) end)
    if cfg.model.moe then
        op("AUX_ALLREDUCE", "every rank's share of the aux loss", { group = "WORLD" },
           function(b)
               b.k("gpt_aux_pack")
               b.coll("allreduce", "world", { n = 1, n_expr = A.E(s, 1), dtype = "f32",
                      red = "sum", send = A.lit("gpt_stat(2)"),
                      text = ">>> all-reduce over the world: every rank's share of the aux loss" })
               b.k("gpt_aux_unpack", A.ident("out"))
           end)
    end
    op("LOSS_ALLREDUCE", "the step's loss (the head stage's tp-rank-0 ranks hold it) and the " ..
       "ranks that want to stop (a signal, a time limit)", { group = "WORLD" }, function(b)
           b.k("gpt_loss_pack", A.ident("in"))
           b.coll("allreduce", "world", { n = 2, n_expr = A.E(s, 2), dtype = "f32", red = "sum",
                  send = A.lit("gpt_stat(0)"),
                  text = ">>> all-reduce over the world: [the step's loss | stop], so that " ..
                         "every rank takes the same decisions" })
           b.k("gpt_loss_unpack", A.ident("out"))
       end)
    op("ADAMW", "clip to --clip, then AdamW" .. (cfg.dist_opt and " on this rank's shards" or "") ..
       "; a step whose loss or gradient norm is not finite changes nothing (out->skipped)", nil,
       function(b) b.k("gpt_adamw", A.ident("in"), A.ident("out")) end)
    -- with the distributed optimizer, the updated shards all-gathered (docs/megatron.md §5.4):
    -- started here in the order the next step's forward reads them and waited there, or (no
    -- overlap) started and waited here
    if #plan.gather > 0 then
        op("PARAM_ALLGATHER", "each bucket's updated parameters all-gathered over its " ..
           "data-parallel group (param_gather_start), " .. (cfg.overlap and "in the order the " ..
           "next step's forward reads them, which waits for each before its first use" or
           "then waited"), nil, function(b)
               for _, a in ipairs(plan.gather) do
                   for _, st in ipairs(a.stmts) do b.stmts[#b.stmts + 1] = st end
               end
               if not cfg.overlap then b.wait_req(plan.gather[1].req, #plan.gather) end
           end)
    end
    local moe = cfg.model.moe
    if moe and moe.expert_bias and nlayers > 0 then
        op("EXPERT_BIAS", string.format("per layer (%d): the step's rows per expert over dp-cp " ..
           "and tp; then each expert bias += rate * sign(mean - count)", nlayers), nil,
           function(b)
               b.loop(A.E(s, nlayers), "l", "the stage's layers, in order", function(l)
                   l.k("gpt_ebias_counts", A.ident("l"))
                   for _, kg in ipairs({ { "DPCP", "dp-cp" }, { "TP", "tp" } }) do
                       if on(kg[1]) then
                           l.coll("allreduce", kg[2], { n = moe.experts,
                                  n_expr = A.E(s, "EXPERTS"), dtype = "i32", red = "sum",
                                  send = A.mem("MS_COUNTS"), text = ">>> all-reduce over " ..
                                  kg[2] .. ": the rows per expert (docs/megatron.md §8.1)" })
                       end
                   end
                   l.k("gpt_ebias_update", A.ident("l"), A.ident("out"))
               end)
           end)
    end
    return ops
end

-- The evaluation of stage r (Megatron's forward_only=True): the library's begin, the
-- forward-only schedule (run_eval_schedule), the loss's world all-reduce as the step's, the
-- library's end. No gradient reduction, norm or optimizer.
local function eval_tail_ops(s)
    local A = layer.arg
    local ops = {}
    local function op(kind, text, fields, body)
        fields = fields or {}
        fields.kind, fields.text = kind, text
        local b = layer.builder()
        body(b)
        fields.stmts = b.stmts
        fields.comm = layer.comm(b.stmts)
        ops[#ops + 1] = ir.Op(fields)
    end
    op("EVAL_BEGIN", "wait for the parameters in flight; until the end no forward starts a " ..
       "gradient reduction", nil,
       function(b) b.k("gpt_eval_begin", A.ident("in")) end)
    op("SCHEDULE", "the forward-only schedule (run_eval_schedule above)", nil,
       function(b) b.k("run_eval_schedule") end)
    op("LOSS_ALLREDUCE", "the evaluation's loss (the head stage's tp-rank-0 ranks hold it)",
       { group = "WORLD" }, function(b)
           b.k("gpt_loss_pack", A.ident("in"))
           b.coll("allreduce", "world", { n = 2, n_expr = A.E(s, 2), dtype = "f32", red = "sum",
                  send = A.lit("gpt_stat(0)"),
                  text = ">>> all-reduce over the world: [the loss | stop], as the step's" })
           b.k("gpt_loss_unpack", A.ident("out"))
       end)
    op("EVAL_END", "what the forwards counted for the training step (the aux loss, the " ..
       "expert counts) back to where the step left it", nil,
       function(b) b.k("gpt_eval_end") end)
    return ops
end

--[[
** The forward-only schedule of an evaluation, from the training schedule's ops: its forwards
** in the same order, on the same slots, with the activation messages of its exchanges; the
** backwards and the gradient messages dropped (an exchange left with none goes too). Each
** forward's collectives are its calls' alone: the asynchronous starts of the training step's
** last micro-batch do not run in an evaluation (gpt_evaluating). A subset of the training
** schedule's rows: it needs no slot, buffer or message the training schedule does not have.
]]
function M.forward_only(ops)
    local out = {}
    for i, o in ipairs(ops) do
        if o.kind == "F" then
            local comm = {}
            for _, c in ipairs(o.calls) do append(comm, c.comm) end
            out[#out + 1] = ir.Op { kind = "F", mb = o.mb, chunk = o.chunk, slot = o.slot,
                                    dy = o.dy, calls = o.calls, comm = comm, text = o.text }
        elseif o.kind == "X" then
            local list = {}
            for _, m in ipairs(o.p2p) do if m.what == "act" then list[#list + 1] = m end end
            -- sent during the computation after it only when that is the training step's
            -- next op, a forward: the step's slots keep the sent activations apart from what
            -- it writes (a slot a backward freed in between could be the one in flight)
            local next = ops[i + 1]
            if #list > 0 then
                out[#out + 1] = ir.Op { kind = "X", p2p = list, comm = {},
                                        async = o.async and next ~= nil and next.kind == "F",
                                        text = o.text }
            end
        end
    end
    return out
end

-- -- One stage --------------------------------------------------------------------------------

-- Ranks that run stage 'k', compactly ("4-7", "1,3,5,7").
local function stage_ranks(topo, k)
    return topology.stage_ranks_text(topo, k)
end

local function build_stage(cfg, topo, part, sh, sched, s, lp, role_index, groups_by_id, r)
    local st = part.stages[r + 1]
    local classes = stage_classes(sh, r)
    local ref = classes[1]
    local stage_sched = sched.stages[r + 1]
    local slots = schedule.assign_slots(stage_sched, cfg.vp)

    local buffers = {}
    for _, b in ipairs(ref.buffers) do
        local bks, base = {}, 0
        for _, bk in ipairs(b.buckets) do
            bks[#bks + 1] = ir.ProgBucket { start = bk.start, size = bk.size, shard = bk.shard,
                                            base = base }
            base = base + bk.shard
        end
        buffers[#buffers + 1] = ir.ProgBuffer {
            chunk = b.chunk, expert = b.kind == "expert", size = b.size,
            state = cfg.dist_opt and b.shard or b.size, sharded = cfg.dist_opt,
            group = b.kind == "expert" and "EDP" or "DPCP", buckets = bks,
        }
    end

    local tables, others, other_pieces = tensor_tables(cfg, st, classes, role_index)
    local chunks, nparams, head = {}, #others, false
    for i, c in ipairs(st.chunks) do
        local t = tables[i]
        nparams = nparams + c.count * #t.params
        head = head or c.head
        local store = M.recompute_plan(cfg, c.count)
        for j, x in ipairs(store) do store[j] = ir.LayerStore(x) end
        chunks[i] = ir.ProgChunk {
            vp = c.vp, first = c.first, layers = c.count, slots = slots.nslots[c.vp],
            embedding = c.embedding, head = c.head, bases = t.bases, shifts = t.shifts,
            store = store,
            slot_bytes = 0,
        }
    end

    -- the shared embedding's gradient (PP > 1: on the first and the last stage)
    local embd, sp_total, nsp = nil, 0, 0
    local at = placement(ref)
    for _, p in ipairs(ref.params) do
        if p.shared_embedding then
            embd = { buf = at[p.name].buf, offset = at[p.name].offset, n = p.numel }
        end
        if cfg.sp and p.seq_parallel then
            sp_total, nsp = sp_total + p.numel, nsp + 1
        end
    end

    local nlayers = 0         -- the stage's layers, every chunk's
    for _, c in ipairs(chunks) do nlayers = nlayers + c.layers end
    local dys = schedule.assign_dy(stage_sched)
    local mem, slot_bytes, params, mem_bytes = memory_plan(cfg, s, chunks, head, nparams,
                                                           sp_total, buffers, nil, dys.n)
    -- interleaved: one pool of slots for the stage's chunks where it takes less memory (it
    -- holds the stage's peak in flight where each chunk's own slots hold the sum of the
    -- chunks' peaks; only chunks of very different sizes make it larger)
    local pool, pool_bytes = 0, 0
    if cfg.vp > 1 then
        local pooled = schedule.assign_slots(stage_sched, cfg.vp, true)
        local own = {}
        for i, c in ipairs(chunks) do own[i], c.slots = c.slots, pooled.nslots[c.vp] end
        local pmem, _, _, ptotal, pbytes = memory_plan(cfg, s, chunks, head, nparams, sp_total,
                                                       buffers, pooled.nslots[0], dys.n)
        if ptotal < mem_bytes then
            mem, mem_bytes, slots = pmem, ptotal, pooled
            pool, pool_bytes = pooled.nslots[0], pbytes
        else
            for i, c in ipairs(chunks) do c.slots = own[i] end
        end
    end
    for i, c in ipairs(chunks) do c.slot_bytes = slot_bytes[i] end
    -- every call of the stage's code stays inside the buffers the plan gives it
    local elems = {}
    for _, m in ipairs(mem) do if m.how == "ALLOC" then elems[m.id] = m.elems end end
    for _, m in ipairs(mem) do if m.how == "ALIAS" then elems[m.id] = elems[m.alias] end end
    local codes = {}
    for _, c in ipairs(chunks) do
        if c.embedding then
            codes[#codes + 1] = lp.embedding_fwd
            codes[#codes + 1] = lp.embedding_bwd
        end
        if c.layers > 0 then codes[#codes + 1] = lp.layer_fwd; codes[#codes + 1] = lp.layer_bwd end
        if c.head then codes[#codes + 1] = lp.head end
    end
    for _, code in ipairs(codes) do
        local why = layer.check_bounds(code.stmts, elems, string.format("stage %d, %s", r,
                                                                        code.name))
        assert(not why, "program: " .. tostring(why) .. " (a generator bug)")
    end

    local layer_params, layer_pieces = {}, {}
    for i, t in ipairs(tables) do layer_params[i], layer_pieces[i] = t.params, t.pieces end
    -- the asynchronous communication (overlap.lua): the schedule's last forward and backward
    -- of each chunk start the reductions of the buckets they complete; their collectives join
    -- the op's in the order they run
    local head_uses_wte = st.chunks[1].embedding and head and cfg.model.tie_embeddings
    local sched_ops = schedule_ops(cfg, s, lp, st, stage_sched, slots, dys, r)
    local plan = overlap.plan(cfg, s, { chunks = chunks, layer_params = layer_params,
                                        other_params = others, head_uses_wte = head_uses_wte },
                              buffers, sched_ops, groups_by_id)
    for _, o in ipairs(sched_ops) do
        if (o.kind == "F" or o.kind == "B") and o.mb == cfg.nmb - 1 then
            local ci
            for i, c in ipairs(chunks) do if c.vp == o.chunk then ci = i end end
            local comm = {}
            for _, it in ipairs(plan.items[ci][o.kind]) do
                if it.kind == "call" then append(comm, it.call.comm)
                elseif it.kind == "start" then append(comm, layer.comm(it.op.stmts)) end
            end
            o.comm = comm
        end
    end
    return ir.StageProgram {
        stage = r, title = string.format("stage %d of %d: %s", r, cfg.pp, M.stage_title(st)),
        ranks = stage_ranks(topo, r), buffers = buffers, chunks = chunks,
        layer_params = layer_params, other_params = others, layer_pieces = layer_pieces,
        other_pieces = other_pieces, nparams = nparams, mem = mem, params = params,
        param_bytes = params.params + params.main + params.grads + params.moments,
        mem_bytes = mem_bytes, needs_inputs = r == 0, needs_targets = r == cfg.pp - 1,
        head_uses_wte = head_uses_wte,
        warmup = stage_sched.warmup, steady = stage_sched.steady,
        cooldown = stage_sched.cooldown, inflight = slots.inflight,
        pool_slots = pool, pool_slot_bytes = pool_bytes, grad_buffers = dys.n,
        schedule = sched_ops, overlap = plan,
        tail = tail_ops(cfg, s, buffers, embd, sp_total, nsp, groups_by_id, nlayers, plan),
        eval_schedule = M.forward_only(sched_ops), eval_tail = eval_tail_ops(s),
    }
end

-- -- Verification: every stage's complete communication --------------------------------------

-- The stages a collective on 'group' (a kind name) of stage r waits for.
local function members_of(prog, cfg, kind, r)
    if kind == "world" then
        local all = {}
        for k = 0, cfg.pp - 1 do all[#all + 1] = k end
        return all, "world"
    end
    for _, g in ipairs(prog.groups) do
        if g.kind == kind then
            if g.grid == "EMBD" then return { 0, cfg.pp - 1 }, kind end
            if g.spans then
                local all = {}
                for k = 0, cfg.pp - 1 do all[#all + 1] = k end
                return all, kind
            end
            return { r }, kind .. "@" .. r
        end
    end
    error("program: no group " .. kind)
end

-- The verifier's view of the program: per stage its schedule steps with every collective of
-- the library calls and of the tail as C steps, in program order; 'eval': the evaluation's
-- (its forward-only schedule and its tail).
function M.events(prog, cfg, eval)
    local stages = {}
    for _, sp in ipairs(prog.stages) do
        local r = sp.stage
        local steps = {}
        local function colls(list)
            for _, c in ipairs(list) do
                local members, key = members_of(prog, cfg, c.group, r)
                steps[#steps + 1] = ir.Step { kind = "C", group = key, members = members,
                                              name = c.op .. " on " .. c.group }
            end
        end
        for _, o in ipairs(eval and sp.eval_schedule or sp.schedule) do
            if o.kind == "F" or o.kind == "B" then
                steps[#steps + 1] = ir.Step { kind = o.kind, mb = o.mb, chunk = o.chunk }
                colls(o.comm)
            elseif o.kind == "X" then
                local ex = {}
                for _, m in ipairs(o.p2p) do
                    ex[#ex + 1] = ir.Exchange { send = m.send, dir = m.dir, what = m.what,
                                                mb = m.mb, chunk = m.chunk }
                end
                steps[#steps + 1] = ir.Step { kind = "X", ops = ex, async = o.async }
            end
        end
        for _, o in ipairs(eval and sp.eval_tail or sp.tail) do colls(o.comm) end
        stages[#stages + 1] = { steps = steps }
    end
    return { P = cfg.pp, V = cfg.vp, M = cfg.nmb, stages = stages }
end

-- The cp ring of stage sp as its CP ranks run it (verify.check_ring): every ring hop of the
-- stage's library calls, in program order; cp rank r sends K|V (tag 2) and dK|dV (tag 3) to
-- r + 1 and receives them from r - 1 (layer.lua ring_hop): the same hops on every cp rank
-- (ring.same, peers relative).
function M.ring_events(sp, cfg, eval)
    local CP, hops = cfg.cp, {}
    local function add(o, what)
        for _, c in ipairs(o.comm) do
            if c.op == "ring" then hops[#hops + 1] = { c = c, what = what } end
        end
    end
    for _, o in ipairs(eval and sp.eval_schedule or sp.schedule) do
        if o.kind == "F" or o.kind == "B" then
            add(o, string.format("%s of mb %d (chunk %d)", o.kind == "F" and "forward"
                                 or "backward", o.mb, o.chunk))
        end
    end
    for _, o in ipairs(eval and sp.eval_tail or sp.tail) do add(o, "the step's tail") end
    local same = {}
    for i, h in ipairs(hops) do
        local ops, c = {}, h.c
        for _, dir in ipairs({ { true, 1 }, { false, -1 } }) do
            local send, delta = dir[1], dir[2]
            if c.n > 0 then ops[#ops + 1] = { send = send, delta = delta, tag = 2, n = c.n } end
            if c.n2 then ops[#ops + 1] = { send = send, delta = delta, tag = 3, n = c.n2 } end
        end
        same[i] = { what = h.what .. ", ring hop " .. i, ops = ops }
    end
    return { CP = CP, same = same }
end

function M.check(prog, cfg, topo)
    local pp = topology.members(topology.kind(topo, "pp"), 0)
    local names = {}
    for r = 0, cfg.pp - 1 do
        names[r] = string.format("stage %d (rank %d)", r, pp[r + 1])
    end
    -- the same stage sources run over MPI (messages matched per tag) and NCCL (no tags); the
    -- training step's schedule, then the evaluation's forward-only one
    for _, eval in ipairs({ false, true }) do
        local ev = M.events(prog, cfg, eval)
        for _, transport in ipairs({ "mpi", "nccl" }) do
            local ok, why = verify.check(ev, { names = names, transport = transport,
                                               forward_only = eval })
            if not ok then
                local lines = {}
                for i, l in ipairs(why) do lines[i] = diag.make(nil, "%s", l) end
                table.insert(lines, 1, diag.make(nil, "the %s failed verification on %s (a " ..
                                                 "generator bug): nothing written",
                                                 eval and "forward-only schedule of the " ..
                                                 "evaluation" or "pipeline schedule",
                                                 transport == "mpi" and "MPI" or "NCCL"))
                diag.raise(lines)
            end
        end
    end
    -- the communication in flight: no call touches what a request covers (overlap.lua)
    for _, sp in ipairs(prog.stages) do
        local ok, why = verify.check_async(overlap.events(sp, cfg), names[sp.stage])
        if not ok then
            local lines = {}
            for i, l in ipairs(why) do lines[i] = diag.make(nil, "%s", l) end
            table.insert(lines, 1, diag.make(nil, "the overlapped communication failed " ..
                                             "verification (a generator bug): nothing written"))
            diag.raise(lines)
        end
    end
    if cfg.cp == 1 then return end
    for _, sp in ipairs(prog.stages) do
        for _, eval in ipairs({ false, true }) do       -- the step's ring, the evaluation's
            local ring = M.ring_events(sp, cfg, eval)
            for _, transport in ipairs({ "mpi", "nccl" }) do
                local ok, why = verify.check_ring(ring, { transport = transport,
                                                  where = "the cp ring of " .. names[sp.stage] ..
                                                  (eval and " (evaluation)" or "") })
                if not ok then
                    local lines = {}
                    for i, l in ipairs(why) do lines[i] = diag.make(nil, "%s", l) end
                    table.insert(lines, 1, diag.make(nil, "the context-parallel ring failed " ..
                                                     "verification on %s (a generator bug): " ..
                                                     "nothing written",
                                                     transport == "mpi" and "MPI" or "NCCL"))
                    diag.raise(lines)
                end
            end
        end
    end
end

-- -- What a checkpoint records of its program -----------------------------------------------------

-- A number as the shortest text that reads back as the same number ("1e-05", not
-- "1.0000000000000001e-05"); integers as integers.
local function num_text(x)
    if math.type(x) == "integer" then return string.format("%d", x) end
    for digits = 1, 17 do
        local t = string.format("%." .. digits .. "g", x)
        if tonumber(t) == x then return t end
    end
    return string.format("%.17g", x)
end

local function value_text(v)
    if v == nil then return "none" end
    if type(v) == "number" then return num_text(v) end
    return tostring(v)
end

-- Fields of a model record that are where it was written, not what it is.
local NOT_MODEL = { name = true, file = true, line = true, lines = true, description = true }

-- The resolved model (config.lua's Model, defaults filled in) as "key=value" lines in the
-- record's declared order (ir.lua), every field that decides the parameters or what they
-- compute; a mixture of experts adds "moe=yes" and its fields as "moe.key=value" ("moe=none"
-- without). The same model gives the same text, whatever its file is called. Resume
-- checkpoints record it (lib/ckpt.c), and --resume names the first field that differs.
function M.model_text(m)
    local out = {}
    for _, k in ipairs(ir.fields(m)) do
        if k == "moe" then
            out[#out + 1] = "moe=" .. (m.moe and "yes" or "none")
            if m.moe then
                for _, mk in ipairs(ir.fields(m.moe)) do
                    if not NOT_MODEL[mk] then
                        out[#out + 1] = "moe." .. mk .. "=" .. value_text(m.moe[mk])
                    end
                end
            end
        elseif not NOT_MODEL[k] then
            out[#out + 1] = k .. "=" .. value_text(m[k])
        end
    end
    return table.concat(out, "\n") .. "\n"
end

-- The layout as "key=value" lines: what decides which parameters and optimizer state a rank
-- holds and where (the parallel sizes, the rank order with the axes Megatron appends, the
-- pipeline split as given, sequence parallelism, the distributed optimizer and its buckets,
-- bf16, the padded vocabulary). Resume checkpoints record it beside the model's text.
function M.layout_text(cfg)
    local fields = {
        { "world", cfg.world }, { "tp", cfg.tp }, { "pp", cfg.pp }, { "dp", cfg.dp },
        { "cp", cfg.cp }, { "ep", cfg.ep }, { "etp", cfg.etp }, { "vp", cfg.vp },
        { "order", table.concat(cfg.axes, "-") },
        { "pipeline_layout", cfg.layout or "even" },
        { "first_layers", cfg.first_layers }, { "last_layers", cfg.last_layers },
        { "account_embedding", cfg.account_embedding }, { "account_loss", cfg.account_loss },
        { "sp", cfg.sp }, { "dist_opt", cfg.dist_opt }, { "bucket_size", cfg.bucket_size },
        { "bf16", cfg.bf16 }, { "vocab_padded", cfg.vocab_padded },
    }
    local out = {}
    for i, f in ipairs(fields) do out[i] = f[1] .. "=" .. value_text(f[2]) end
    return table.concat(out, "\n") .. "\n"
end

-- -- The program ---------------------------------------------------------------------------------

-- Layouts the training programs do not support yet (the topology can still be inspected).
function M.supported(cfg)
    if cfg.model.moe and cfg.tp > 1 and not cfg.sp then
        return false, string.format("mixture of experts with TP (%d) > 1 needs sequence " ..
                                    "parallelism: add SP=1 (Megatron refuses to train MoE with " ..
                                    "tensor parallelism without it)", cfg.tp)
    end
    return true
end

-- opts.verify = false: skip M.check (the planner, plan.lua, verifies only the layout it
-- recommends; every program the generator writes is checked).
function M.build(cfg, topo, part, sh, sched, opts)
    local ok, why = M.supported(cfg)
    if not ok then diag.error(nil, "%s", why) end
    local layout = string.format("tp%d pp%d dp%d", cfg.tp, cfg.pp, cfg.dp)
    if cfg.cp > 1 then layout = layout .. " cp" .. cfg.cp end
    if cfg.vp > 1 then layout = layout .. " vp" .. cfg.vp end
    local s = M.sizes(cfg)
    local role_list, role_index = roles(cfg)
    local group_list = groups(cfg, topo)
    -- the layer's code: which optional tensors (biases) the model has decides its calls
    local present = {}
    for _, p in ipairs(shards.global_params(cfg.model)) do
        if FIELD[p.role] then present[FIELD[p.role]] = true end
    end
    local lp = layer.build(cfg, s, present)
    local by_id = { WORLD = { create = true, kind = "world" } }
    for _, g in ipairs(group_list) do by_id[g.id] = g end
    local stages = {}
    for r = 0, cfg.pp - 1 do
        stages[r + 1] = build_stage(cfg, topo, part, sh, sched, s, lp, role_index, by_id, r)
    end
    local prog = ir.Program {
        model = cfg.model.file, layout = layout, schedule_kind = sched.kind,
        model_text = M.model_text(cfg.model), layout_text = M.layout_text(cfg),
        made_by = cfg.make,
        consts = consts(cfg, s, layout), roles = role_list, dense = grid_axes(topo.dense),
        expert = grid_axes(topo.expert), groups = group_list, stages = stages, layer = lp,
    }
    if not (opts and opts.verify == false) then M.check(prog, cfg, topo) end
    return prog
end

return M
