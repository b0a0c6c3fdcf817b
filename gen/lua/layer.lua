-- layer.lua: the code of a stage's model pieces -- the embedding, the transformer layer (GPT-2
-- or Llama, dense or mixture of experts, with tensor, sequence and context parallelism and
-- selective recompute) and the head with its loss, forward and backward -- as statements:
-- every library kernel call, every collective and every point-to-point message, in the order
-- the rank runs them, with their arguments. emit.lua prints them as the stage's C functions;
-- program.lua hands their communication to the verifier and to make inspect. One owner per
-- fact: a collective exists because a statement here says so, and the same record is printed,
-- verified and counted (docs/DESIGN.md §4.2).
--
-- layer.build(cfg, s, present) -> LayerProgram. Pure. s: program.sizes(cfg); present: the set
-- of the layer's parameter fields (GPT_P_ suffixes) the model has (its biases are optional).
-- Arguments are typed records (ir.lua Arg, Expr); kernels are checked against their signatures
-- (M.SIGNATURES): the argument count and kinds, and for every memory-plan buffer argument that
-- the elements the call touches lie inside the buffer the plan allocates (M.check_bounds).

local diag = require("diag")
local ir = require("ir")

local M = {}

-- -- Expressions and arguments --------------------------------------------------------------

-- An integer expression: a sum of terms, each an integer coefficient times factors. A factor
-- is the name of a size (N_SP: program.sizes' n_sp, printed CFG_N_SP) or a C expression
-- evaluated at run time (a loop variable, an accessor), which has no value here.
local SIZE_KEY = {
    N = "N", N_SP = "n_sp", C = "C", B = "B", T = "T", SEQ = "seq", T_CHUNK = "t_chunk",
    HEADS_LOCAL = "heads_local", HEAD_DIM = "head_dim", C_LOCAL = "c_local",
    QKV_LOCAL = "qkv_local", FF_LOCAL = "ff_local", V_LOCAL = "v_local", KV_LOCAL = "kv_local",
    KV_C = "kv_c", CP = "cp", EXPERTS = "E", TOPK = "K", AUX_SEQS = "aux_seqs",
    EP = "ep", EXPERTS_LOCAL = "nl", CP_HEADS = "cp_heads", CP_HW = "cp_hw", CP_KV = "cp_kv",
    CP_KVW = "cp_kvw",
    ACT_SIZE = "act_size",
}
M.SIZE_KEY = SIZE_KEY

local INT_MAX = 2147483647      -- the generated code computes an Expr in C int arithmetic

-- 'value' of the C expression 'text' fits an int, or a user error names it (the sizes are
-- the user's: MBS, SEQ, the model's).
local function check_fits(text, value)
    if value > INT_MAX or value < -INT_MAX - 1 then
        diag.error(nil, "the generated code computes %s = %d in C int arithmetic, which " ..
                   "overflows (at most %d): lower the sizes it is made of (MBS, SEQ, the " ..
                   "model's)", text, value, INT_MAX)
    end
end

-- The product of the integers and names in ..., as an Expr of one term. Each step of the
-- product as C computes it (coefficient first, then the factors in order) must fit an int,
-- as far as the factors are known here.
local function E(s, ...)
    local c, f, v = 1, {}, 1
    for _, x in ipairs({ ... }) do
        if math.type(x) == "integer" then
            c = c * x
            if v then v = v * x end
        else
            f[#f + 1] = x
            local key = SIZE_KEY[x]
            local n = key and s[key]
            if v and n then v = v * n else v = nil end
        end
    end
    local p, text = c, (c ~= 1 or #f == 0) and tostring(c) or nil
    if text then check_fits(text, p) end
    for _, x in ipairs(f) do
        local key = SIZE_KEY[x]
        local n = key and s[key]
        if not n then break end
        p, text = p * n, (text and text .. " * " or "") .. "CFG_" .. x
        check_fits(text, p)
    end
    return ir.Expr { terms = { ir.Term { c = c, f = f } }, value = v }
end
M.E = E

-- a + b (Exprs)
local function plus(a, b)
    local terms = {}
    for _, t in ipairs(a.terms) do terms[#terms + 1] = t end
    for _, t in ipairs(b.terms) do terms[#terms + 1] = t end
    local v = a.value and b.value and a.value + b.value
    if v then check_fits("a sum of offsets", v) end
    return ir.Expr { terms = terms, value = v }
end

-- Argument constructors (ir.lua Arg).
local function mem(id, off) return ir.Arg { kind = "mem", id = id, off = off } end
local function param(f) return ir.Arg { kind = "param", id = f } end
local function grad(f) return ir.Arg { kind = "grad", id = f } end
local function int(e) return ir.Arg { kind = "int", expr = e } end
local function num(name) return ir.Arg { kind = "float", id = name } end
local function lit(text) return ir.Arg { kind = "lit", id = text } end
local function ident(name) return ir.Arg { kind = "ident", id = name } end
local NULL = ir.Arg { kind = "lit", id = "NULL" }
local ACT = ir.Arg { kind = "dtype", id = "ACT" }
local F32 = ir.Arg { kind = "dtype", id = "F32" }
M.arg = { mem = mem, param = param, grad = grad, int = int, num = num, lit = lit, ident = ident,
          NULL = NULL, ACT = ACT, F32 = F32, E = E, plus = plus }

-- -- Signatures -------------------------------------------------------------------------------

-- Every function the statements call, with its parameters in order: a scalar (a name), or a
-- pointer { name, dtype (A: the activations' dtype, F: f32, I: i32, any), then the factors of
-- the elements it touches: parameter names and integers; none: not checked }. A name ending
-- in '?' may be NULL. lib/kernels.h, the library's composites (lib/ops.h: matmul, linear,
-- the context-parallel blocks), its mixture-of-experts steps (lib/moe.h) and two runtime calls.
local SIG = {}
local function sig(name, spec) SIG[name] = spec end
sig("embed_fwd", { { "out", "A", "N", "C" }, { "tok", "I", "N" }, { "wte", "A", "vrows", "C" },
                   "N", "C", "vstart", "vrows", "t" })
sig("embed_bwd", { { "dwte", "F", "vrows", "C" }, { "dout", "A", "N", "C" }, { "tok", "I", "N" },
                   "N", "C", "vstart", "vrows", "t" })
sig("pos_fwd", { { "out", "A", "T", "B", "C" }, { "wpe", "A" }, "T", "B", "C", "t0", "t" })
sig("pos_bwd", { { "dwpe", "F" }, { "dout", "A", "T", "B", "C" }, "T", "B", "C", "t0", "t" })
sig("layernorm_fwd", { { "out", "A", "N", "C" }, { "mean", "F", "N" }, { "rstd", "F", "N" },
                       { "inp", "A", "N", "C" }, { "w", "A", "C" }, { "b?", "A", "C" },
                       "N", "C", "eps", "t" })
sig("layernorm_bwd", { { "dinp", "A", "N", "C" }, { "dw", "F", "C" }, { "db?", "F", "C" },
                       { "dout", "A", "N", "C" }, { "inp", "A", "N", "C" }, { "w", "A", "C" },
                       { "mean", "F", "N" }, { "rstd", "F", "N" }, "N", "C", "t" })
sig("rmsnorm_fwd", { { "out", "A", "N", "C" }, { "rstd", "F", "N" }, { "inp", "A", "N", "C" },
                     { "w", "A", "C" }, "N", "C", "eps", "t" })
sig("add_layernorm_fwd", { { "res", "A", "N", "C" }, { "out", "A", "N", "C" }, { "mean", "F", "N" },
                           { "rstd", "F", "N" }, { "a", "A", "N", "C" }, { "b", "A", "N", "C" },
                           { "w", "A", "C" }, { "bias?", "A", "C" }, "N", "C", "eps", "t" })
sig("add_rmsnorm_fwd", { { "res", "A", "N", "C" }, { "out", "A", "N", "C" }, { "rstd", "F", "N" },
                         { "a", "A", "N", "C" }, { "b", "A", "N", "C" }, { "w", "A", "C" },
                         "N", "C", "eps", "t" })
sig("rmsnorm_bwd", { { "dinp", "A", "N", "C" }, { "dw", "F", "C" }, { "dout", "A", "N", "C" },
                     { "inp", "A", "N", "C" }, { "w", "A", "C" }, { "rstd", "F", "N" },
                     "N", "C", "t" })
sig("gelu_fwd", { { "out", "A", "n" }, { "inp", "A", "n" }, "n", "t" })
sig("gelu_bwd", { { "dinp", "A", "n" }, { "inp", "A", "n" }, { "dout", "A", "n" }, "n", "t" })
sig("bias_fwd", { { "out", "A", "N", "OC" }, { "bias", "A", "OC" }, "N", "OC", "t" })
sig("bias_bwd", { { "dbias", "F", "OC" }, { "dout", "A", "N", "OC" }, "N", "OC", "t" })
sig("add_fwd", { { "out", "A", "n" }, { "a", "A", "n" }, { "b", "A", "n" }, "n", "t" })
sig("add_inplace", { { "y", "A", "n" }, { "x", "A", "n" }, "n", "t" })
sig("convert", { { "dst", "any", "n" }, "dt", { "src", "any", "n" }, "st", "n" })
-- q|k|v rows of Hl query heads and KVl kv heads (grouped-query attention, lib/kernels.h)
local function qkv_rows(p) return p.B * p.T * (p.Hl + 2 * p.KVl) * p.hd end
sig("attention_fwd", { { "out", "A", "B", "T", "Hl", "hd" }, { "lse", "F", "B", "Hl", "T" },
                       { "qkv", "A", qkv_rows }, "B", "T", "Hl", "KVl", "hd", "scale", "t" })
sig("attention_bwd", { { "dqkv", "A", qkv_rows }, { "dsum", "F", "B", "Hl", "T" },
                       { "dout", "A", "B", "T", "Hl", "hd" }, { "out", "A", "B", "T", "Hl", "hd" },
                       { "lse", "F", "B", "Hl", "T" }, { "qkv", "A", qkv_rows },
                       "B", "T", "Hl", "KVl", "hd", "scale", "t" })
sig("attention_dsum", { { "dsum", "F", "B", "Hl", "T" }, { "dout", "A", "B", "T", "Hl", "hd" },
                        { "out", "A", "B", "T", "Hl", "hd" }, "B", "T", "Hl", "hd", "t" })
-- strided rows: the last row ends 'cols' (or 'width') past its start
local function rows_of(rows, ld, width)
    return function(p) return (p[rows] - 1) * p[ld] + p[width] end
end
sig("copy_cols", { { "dst", "any", rows_of("rows", "ldd", "cols") }, "dt", "ldd",
                   { "src", "any", rows_of("rows", "lds", "cols") }, "st", "lds", "rows", "cols" })
sig("fill_f32", { { "x", "F", "n" }, "n", "v" })
sig("rope_fwd", { { "x", "A", function(p) return (p.T * p.B - 1) * p.ld + p.H * p.hd end }, "ld",
                  "T", "B", "H", "hd", "pos0", "theta", "inverse", "t" })
sig("swiglu_fwd", { { "out", "A", "N", "F" }, { "gu", "A", "N", 2, "F" }, "N", "F", "t" })
sig("swiglu_bwd", { { "dgu", "A", "N", 2, "F" }, { "dout", "A", "N", "F" },
                    { "gu", "A", "N", 2, "F" }, "N", "F", "t" })
sig("ce_rowmax", { { "mx", "F", "N" }, { "logits", "A", "N", "Vl" }, "N", "Vl", "valid", "t" })
sig("ce_sums", { { "sums", "F", 2, "N" }, { "logits", "A", "N", "Vl" }, { "mx", "F", "N" },
                 { "targets", "I", "N" }, "N", "Vl", "valid", "vstart", "t" })
sig("ce_loss", { { "loss", "F", "N" }, { "sums", "F", 2, "N" }, { "mx", "F", "N" }, "N" })
sig("ce_bwd", { { "logits", "A", "N", "Vl" }, { "mx", "F", "N" }, { "sums", "F", 2, "N" },
                { "targets", "I", "N" }, "N", "Vl", "valid", "vstart", "dloss", "t" })
sig("ce_fused", { { "loss", "F", "N" }, { "mx", "F", "N" }, { "sums", "F", 2, "N" },
                  { "logits", "A", "N", "Vl" }, { "targets", "I", "N" }, "N", "Vl", "valid",
                  "vstart", "dloss", "t" })
sig("sum_rows", { { "out", "F", 1 }, { "x", "F", "N" }, "N" })
sig("matmul_fwd", { { "out", "A", "N", "OC" }, { "inp", "A", "N", "IC" },
                    { "w", "A", "IC", "OC" }, { "bias?", "A", "OC" }, "N", "IC", "OC", "t" })
sig("matmul_gelu_fwd", { { "pre", "A", "N", "OC" }, { "out", "A", "N", "OC" },
                         { "inp", "A", "N", "IC" }, { "w", "A", "IC", "OC" }, { "bias?", "A", "OC" },
                         "N", "IC", "OC", "t" })
sig("matmul_bwd_gelu", { { "dinp", "A", "N", "IC" }, { "dw", "F", "IC", "OC" },
                         { "dout", "A", "N", "OC" }, { "inp", "A", "N", "IC" },
                         { "w", "A", "IC", "OC" }, { "pre", "A", "N", "IC" }, "N", "IC", "OC", "t" })
sig("matmul_bwd", { { "dinp", "A", "N", "IC" }, { "dw", "F", "IC", "OC" },
                    { "dbias?", "F", "OC" }, { "dout", "A", "N", "OC" },
                    { "inp", "A", "N", "IC" }, { "w", "A", "IC", "OC" }, "N", "IC", "OC", "t" })
sig("linear_fwd", { { "out", "A", rows_of("N", "ldo", "OC") }, "ldo", { "inp", "A", "N", "IC" },
                    { "w", "A", "OC", "IC" }, "N", "IC", "OC", "t" })
sig("linear_bwd", { { "dinp", "A", "N", "IC" }, "beta", { "dw", "F", "OC", "IC" },
                    { "dout", "A", rows_of("N", "ldd", "OC") }, "ldd", { "inp", "A", "N", "IC" },
                    { "w", "A", "OC", "IC" }, "N", "IC", "OC", "t" })
sig("cp_ring_fwd_block", { "i", "cp", "cp_rank", { "acc", "F", "B", "T", "Hl", "hd" },
                           { "lse", "F", "B", "Hl", "T" }, { "qkv", "A", qkv_rows },
                           { "kv", "A", "B", "T", 2, "KVl", "hd" }, "B", "T", "Hl", "KVl", "hd",
                           "scale", "t" })
sig("cp_ring_bwd_block", { "i", "cp", "cp_rank", { "dq", "F", "B", "T", "Hl", "hd" },
                           { "dkv", "F", "B", "T", 2, "KVl", "hd" },
                           { "dout", "A", "B", "T", "Hl", "hd" }, { "lse", "F", "B", "Hl", "T" },
                           { "dsum", "F", "B", "Hl", "T" }, { "qkv", "A", qkv_rows },
                           { "kv", "A", "B", "T", 2, "KVl", "hd" }, "B", "T", "Hl", "KVl", "hd",
                           "scale", "t" })
local function a2a_rows(p) return p.N * (p.qc + 2 * p.kc) end
sig("cp_a2a_heads", { { "blocks", "A", a2a_rows }, { "rows", "A", a2a_rows },
                      "qc", "kc", "pack", "N", "cp", "t" })
sig("cp_a2a_order", { { "dst", "A", "N", "cp", "w" }, { "src", "A", "N", "cp", "w" }, "w",
                      "to_seq", "N", "cp", "tc", "B", "t" })
sig("scale_inplace", { { "x", "F", "n" }, "n", "s" })
sig("rt_memcpy", { { "dst", "any" }, { "src", "any" }, "bytes", "kind" })
sig("rt_memcpy_async", { { "dst", "any" }, { "src", "any" }, "bytes", "kind" })
sig("rt_memset0", { { "p", "any" }, "bytes" })
-- the mixture of experts' steps (lib/moe.h): the layer's routing state 'm', its tensors 'w'
-- and their gradients 'dw'
sig("moe_router_fwd", { "m", "w", { "x", "A", "N", "C" }, { "counts", "I" } })
sig("moe_dispatch", { "m", "w", { "x", "A", "N", "C" }, { "counts", "I" }, "again" })
sig("moe_recv_plan", { "m", { "counts", "I" } })
sig("moe_member_plan", { "m", { "counts", "I" } })
sig("moe_experts_fwd", { "m", "w", { "x", "A" }, { "p", "F" } })
sig("moe_sum_members", { "m", { "out", "any" }, { "blocks", "any" }, "width", "t" })
sig("moe_combine", { "m", { "out", "A", "N", "C" }, { "src", "A" } })
sig("moe_bwd_rows", { "m", { "dout", "A", "N", "C" } })
sig("moe_experts_bwd", { "m", "w", "dw", { "dy", "A" } })
sig("moe_router_bwd", { "m", "w", "dw", { "x", "A", "N", "C" }, { "dxs", "A" }, { "dps", "F" },
                        { "dx", "A", "N", "C" } })
-- the step around the schedule (lib/gpt.h): its pieces between the collectives
sig("gpt_step_begin", { "in" })
sig("run_schedule", {})
sig("run_eval_schedule", {})
sig("gpt_eval_begin", { "in" })
sig("gpt_eval_end", {})
sig("gpt_sp_pack", {})
sig("gpt_sp_unpack", {})
sig("gpt_norm_local", {})
sig("gpt_norm_set", { "out", "total" })
sig("gpt_aux_pack", {})
sig("gpt_aux_unpack", { "out" })
sig("gpt_loss_pack", { "in" })
sig("gpt_loss_unpack", { "out" })
sig("gpt_adamw", { "in", "out" })
sig("gpt_ebias_counts", { "layer" })
sig("gpt_ebias_update", { "layer", "out" })
M.SIGNATURES = SIG

-- -- Statements -------------------------------------------------------------------------------

-- One function's statements: K (a call), C (a collective), P (a p2p call, blocking or
-- started), W (the wait of the started one), LOOP (a counted loop around statements), NOTE
-- (a comment). Each K is checked against its signature's parameter count here.
local function builder()
    local b = { stmts = {} }
    function b.k(fn, ...)
        local sg = assert(SIG[fn], "layer: no signature for " .. fn)
        local args = { ... }
        assert(#args == #sg, string.format("layer: %s takes %d arguments, given %d", fn, #sg,
                                           #args))
        b.stmts[#b.stmts + 1] = ir.Stmt { kind = "K", fn = fn, args = args }
    end
    function b.note(text) b.stmts[#b.stmts + 1] = ir.Stmt { kind = "NOTE", text = text } end
    function b.coll(op, group, fields)
        local text = fields.text
        fields.text = nil
        fields.op, fields.group = op, group
        b.stmts[#b.stmts + 1] = ir.Stmt { kind = "C", coll = ir.Coll(fields), text = text }
    end
    -- an asynchronous collective started into request slot 'req' (rt_*_start), and its wait
    function b.start(op, group, req, fields)
        local text = fields.text
        fields.text = nil
        fields.op, fields.group = op, group
        b.stmts[#b.stmts + 1] = ir.Stmt { kind = "S", coll = ir.Coll(fields), req = req,
                                          text = text }
    end
    -- the wait of request slots req .. req + count - 1 (count: 1 if nil), in that order
    function b.wait_req(req, count)
        b.stmts[#b.stmts + 1] = ir.Stmt { kind = "WAIT", req = req, nreq = count or 1 }
    end
    function b.loop(count, var, text, body)
        local inner = builder()
        body(inner)
        b.stmts[#b.stmts + 1] = ir.Stmt { kind = "LOOP", count = count, var = var,
                                          body = inner.stmts, text = text }
    end
    return b
end

M.builder = builder

-- The elements a pointer parameter touches, from the call's scalar values (nil: unknown).
local function footprint(spec, vals)
    if type(spec[3]) == "function" then
        local ok, v = pcall(spec[3], vals)
        return ok and v or nil
    end
    if #spec < 3 then return nil end
    local n = 1
    for i = 3, #spec do
        local f = spec[i]
        local v = math.type(f) == "integer" and f or vals[f]
        if not v then return nil end
        n = n * v
    end
    return n
end

--[[
** Check every call of 'stmts' against its signature: for each pointer argument that is a
** buffer of the memory plan, offset + the elements the call touches <= the elements the plan
** allocates ('elems': plan entry -> elements of one instance, aliases resolved). Returns nil,
** or a message naming the call, the buffer and the numbers (a generator bug: a short plan
** would be an overrun at run time). Values known only at run time are not checked.
]]
function M.check_bounds(stmts, elems, where)
    for _, st in ipairs(stmts) do
        if st.kind == "K" then
            local sg = SIG[st.fn]
            local vals = {}
            for i, p in ipairs(sg) do
                local a = st.args[i]
                if type(p) == "string" and a.kind == "int" and a.expr.value then
                    vals[p] = a.expr.value
                end
            end
            for i, p in ipairs(sg) do
                local a = st.args[i]
                if type(p) == "table" and a.kind == "mem" then
                    local have = elems[a.id]
                    if not have then
                        return string.format("%s: %s() argument %d is %s, which this stage's " ..
                                             "memory plan does not allocate", where, st.fn, i,
                                             a.id)
                    end
                    local off = a.off and a.off.value or (not a.off and 0) or nil
                    local need = footprint(p, vals)
                    if off and need and off + need > have then
                        return string.format("%s: %s() touches %d elements of %s from %d, the " ..
                                             "plan allocates %d", where, st.fn, need, a.id, off,
                                             have)
                    end
                end
            end
        elseif st.kind == "LOOP" then
            local why = M.check_bounds(st.body, elems, where)
            if why then return why end
        end
    end
    return nil
end

-- Every collective of a statement list as it runs, loops unrolled by their counts (Coll
-- records, for the verifier and make inspect).
function M.comm(stmts, out)
    out = out or {}
    for _, st in ipairs(stmts) do
        if st.kind == "C" or st.kind == "P" or st.kind == "S" then
            out[#out + 1] = st.coll
        elseif st.kind == "LOOP" then
            for _ = 1, st.count.value do M.comm(st.body, out) end
        end
    end
    return out
end

-- -- The mixture of experts' load ------------------------------------------------------------

-- The rows of a MoE layer at a balanced load (every expert chosen alike), per micro-batch on
-- one rank: what its all-to-alls move (make inspect's traffic; the Coll records' rows). Under SP
-- a tp rank routes its own sequence shard; a capacity factor caps each expert's choices
-- (Megatron's get_capacity on the router's own tokens); padding sends every expert exactly
-- min(capacity, tokens) rows. -> { tokens, choices, kept, capacity (nil without a factor),
-- rows_ep (to each EP peer; fractional when EP does not divide the kept choices), rows_etp
-- (a rank's experts' rows, which the expert-TP group gathers) }; nil for a dense model.
function M.moe_load(cfg, s)
    local moe = cfg.model.moe
    if not moe then return nil end
    local choices = s.n_sp * s.K
    local kept, cap = choices, nil
    if moe.capacity_factor then
        cap = s.capacity
        local even = s.n_sp * s.K / s.E
        if cap < even then kept = choices * cap / even end
        if s.pad_rows > 0 then kept = s.E * s.pad_rows end
    end
    return { tokens = s.n_sp, choices = choices, kept = kept, capacity = cap,
             rows_ep = kept / cfg.ep, rows_etp = kept }
end

-- -- The model pieces -------------------------------------------------------------------------

-- The layer pieces of cfg (every stage runs the same layer): embedding_fwd, embedding_bwd,
-- layer_fwd, layer_bwd, head (ir.lua LayerProgram; each a Code of statements).
function M.build(cfg, s, present)
    local llama, moe = s.llama, cfg.model.moe
    local act = cfg.bf16 and "bf16" or "f32"
    local rc = {}
    for _, mod in ipairs(cfg.recompute_modules) do rc[mod] = true end
    local function has(f) return present[f] == true end
    local function w_or_null(f) return has(f) and param(f) or NULL end
    -- A row-parallel bias (the attention's and the MLP's output projections) is added after
    -- the sum over tp; on one tp rank there is no sum, and it goes into the product itself
    -- (matmul_fwd's bias: a cuBLASLt epilogue on CUDA, the same bias_fwd on the CPU).
    local function row_bias_in_product(f) return cfg.tp == 1 and has(f) end
    local function g_or_null(f) return has(f) and grad(f) or NULL end
    local ROWS = E(s, "N_SP", "C")       -- this rank's rows between the layers
    local function I(...) return int(E(s, ...)) end
    -- grouped-query attention (lib/kernels.h): q|k|v rows hold HEADS_LOCAL query heads and
    -- KVH kv heads, KVC channels each of k and v (GPT: every head has its own)
    local KVH = llama and "KV_LOCAL" or "HEADS_LOCAL"
    local KVC = llama and { "KV_C" } or { "C_LOCAL" }
    local function EK(...)               -- the product of ... and KVC
        local f = { ... }
        for _, x in ipairs(KVC) do f[#f + 1] = x end
        return E(s, table.unpack(f))
    end
    local function IK(...) return int(EK(...)) end

    -- the column-parallel input gathered over tp under SP (docs/megatron.md §4.1): returns the
    -- argument that holds the whole sequence
    local function gather_seq(b, from, into, what)
        if not cfg.sp then return from end
        b.coll("allgather", "tp", { n = s.n_sp * s.C, n_expr = ROWS, dtype = act, send = from,
               recv = mem(into), text = string.format(">>> all-gather over tp: %s, (N_SP, C) " ..
               "from each rank -> (N, C) (docs/megatron.md §4.1)", what) })
        return mem(into)
    end
    -- the row-parallel output reduced over tp: reduce-scattered to this rank's rows under SP,
    -- else all-reduced in place; returns the argument holding the result
    local function reduce_seq(b, partial, what)
        if cfg.sp then
            b.coll("reduce_scatter", "tp", { n = s.n_sp * s.C, n_expr = ROWS, dtype = act,
                   send = partial, recv = mem("S_FULL_SP"), text = string.format(">>> " ..
                   "reduce-scatter over tp: %s, (N, C) partial sums -> this rank's (N_SP, C) " ..
                   "(docs/megatron.md §4.1)", what) })
            return mem("S_FULL_SP")
        end
        if cfg.tp > 1 then
            b.coll("allreduce", "tp", { n = s.N * s.C, n_expr = E(s, "N", "C"), dtype = act,
                   red = "sum", send = partial, text = string.format(">>> all-reduce over " ..
                   "tp: %s, the sum of every rank's partial products (docs/megatron.md §4.1)",
                   what) })
        end
        return partial
    end

    local function norm_fwd(b, out, mean, rstd, x, wf, bf)
        if llama then
            b.k("rmsnorm_fwd", out, mem(rstd), x, param(wf), I("N_SP"), I("C"),
                num("CFG_LN_EPS"), ACT)
        else
            b.k("layernorm_fwd", out, mem(mean), mem(rstd), x, param(wf), param(bf), I("N_SP"),
                I("C"), num("CFG_LN_EPS"), ACT)
        end
    end
    local function norm_bwd(b, dinp, wf, bf, dout, x, mean, rstd)
        if llama then
            b.k("rmsnorm_bwd", dinp, grad(wf), dout, x, param(wf), mem(rstd), I("N_SP"), I("C"),
                ACT)
        else
            b.k("layernorm_bwd", dinp, grad(wf), grad(bf), dout, x, param(wf), mem(mean),
                mem(rstd), I("N_SP"), I("C"), ACT)
        end
    end
    local function ln1_fwd(b, x)
        norm_fwd(b, mem("L_LN1"), "L_LN1_MEAN", "L_LN1_RSTD", x, "LN1_W", "LN1_B")
    end
    local function ln2_fwd(b)
        norm_fwd(b, mem("L_LN2"), "L_LN2_MEAN", "L_LN2_RSTD", mem("L_RES1"), "LN2_W", "LN2_B")
    end
    -- res1 = x + the attention's output, then ln_2 of res1: one kernel, the same bits as
    -- add_fwd then ln2_fwd (one read of res1 less)
    local function add_ln2_fwd(b, x, proj)
        if llama then
            b.k("add_rmsnorm_fwd", mem("L_RES1"), mem("L_LN2"), mem("L_LN2_RSTD"), x, proj,
                param("LN2_W"), I("N_SP"), I("C"), num("CFG_LN_EPS"), ACT)
        else
            b.k("add_layernorm_fwd", mem("L_RES1"), mem("L_LN2"), mem("L_LN2_MEAN"),
                mem("L_LN2_RSTD"), x, proj, param("LN2_W"), param("LN2_B"), I("N_SP"), I("C"),
                num("CFG_LN_EPS"), ACT)
        end
    end

    -- -- Context parallelism: the attention core (docs/megatron.md §12) ----------------------

    local NKV = EK("N", 2)                           -- one K|V block on the ring
    local function block(id, i) return mem(id, EK(i, "N", 2)) end
    -- one hop: block i_send to the next cp rank, block i_recv from the previous one
    local function ring_hop(b, kv, what, i_send, i_recv, start)
        local id, tag, dt = "S_RING_DKV", "RING_DKV", "f32"
        if kv then id, tag, dt = "S_RING_KV", "RING_KV", act end
        local n = s.N * 2 * s.kv_c
        b.stmts[#b.stmts + 1] = ir.Stmt {
            kind = "P", start = start,
            msgs = { ir.Msg { send = true, buf = block(id, i_send), n = NKV, dtype = dt,
                              peer = "CP_NEXT", tag = tag },
                     ir.Msg { send = false, buf = block(id, i_recv), n = NKV, dtype = dt,
                              peer = "CP_PREV", tag = tag } },
            coll = ir.Coll { op = "ring", group = "cp", dtype = dt, n = kv and n or 0,
                             n2 = not kv and n or nil },
            text = string.format(">>> p2p on the cp ring: %s to the next cp rank, the " ..
                                 "previous one's from it (docs/megatron.md §12)", what),
        }
    end
    local function wait(b) b.stmts[#b.stmts + 1] = ir.Stmt { kind = "W" } end
    local function ring_block(b, fn, i, bufs)
        local args = { int(E(s, i)), I("CP"), lit("gpt_cp_rank()") }
        for _, a in ipairs(bufs) do args[#args + 1] = a end
        for _, a in ipairs({ I("B"), I("T"), I("HEADS_LOCAL"), I(KVH), I("HEAD_DIM"),
                             num("CFG_ATT_SCALE"), ACT }) do
            args[#args + 1] = a
        end
        b.k(fn, table.unpack(args))
    end
    local function ring_pack(b)          -- this rank's K|V (of its q|k|v) into ring block 0
        b.k("copy_cols", mem("S_RING_KV"), ACT, IK(2), mem("L_QKV", E(s, "C_LOCAL")),
            ACT, I("QKV_LOCAL"), I("N"), IK(2))
    end
    local CUR, NXT, LAST = "(i % 2)", "((i + 1) % 2)", "((CFG_CP - 1) % 2)"
    local CPM1 = plus(E(s, "CP"), E(s, -1))              -- the hops: CP - 1
    local function ring_fwd(b)
        b.note("attention around the cp ring (docs/megatron.md §12): this rank's K|V block, " ..
               "then CP-1 hops; each block is attended to while the next one travels, merged " ..
               "into the f32 output and log-sum-exp")
        ring_pack(b)
        b.k("rt_memset0", mem("S_RING_ACC"), I("N", "C_LOCAL", 4))
        b.k("fill_f32", mem("L_LSE"), I("B", "HEADS_LOCAL", "T"), lit("-INFINITY"))
        local function bufs(i)
            return { mem("S_RING_ACC"), mem("L_LSE"), mem("L_QKV"), block("S_RING_KV", i) }
        end
        b.loop(CPM1, "i", "hops 0 .. CP-2", function(l)
            ring_hop(l, true, "K|V block i", CUR, NXT, true)
            ring_block(l, "cp_ring_fwd_block", "i", bufs(CUR))
            wait(l)
        end)
        ring_block(b, "cp_ring_fwd_block", "(CFG_CP - 1)", bufs(LAST))
        b.k("convert", mem("L_ATTY"), ACT, mem("S_RING_ACC"), F32, I("N", "C_LOCAL"))
    end
    local function ring_bwd(b)
        b.note("its backward: the K|V blocks travel the ring again, each with the f32 dK|dV " ..
               "its visited ranks added; one more hop brings every block's dK|dV home")
        b.k("attention_dsum", mem("S_DSUM"), mem("S_DATTY"), mem("L_ATTY"), I("B"), I("T"),
            I("HEADS_LOCAL"), I("HEAD_DIM"), ACT)
        ring_pack(b)
        b.k("rt_memset0", mem("S_RING_ACC"), I("N", "C_LOCAL", 4))
        b.k("rt_memset0", mem("S_RING_DKV"), IK("N", 2, 4))
        local function bufs(i)
            return { mem("S_RING_ACC"), block("S_RING_DKV", i), mem("S_DATTY"), mem("L_LSE"),
                     mem("S_DSUM"), mem("L_QKV"), block("S_RING_KV", i) }
        end
        b.loop(CPM1, "i", "hops 0 .. CP-2", function(l)
            ring_hop(l, true, "K|V block i", CUR, NXT, true)
            ring_block(l, "cp_ring_bwd_block", "i", bufs(CUR))
            wait(l)
            ring_hop(l, false, "block i's dK|dV", CUR, NXT, false)
        end)
        ring_block(b, "cp_ring_bwd_block", "(CFG_CP - 1)", bufs(LAST))
        ring_hop(b, false, "the last block's dK|dV", LAST, "(CFG_CP % 2)", false)
        b.k("copy_cols", mem("S_DQKV"), ACT, I("QKV_LOCAL"), mem("S_RING_ACC"), F32,
            I("C_LOCAL"), I("N"), I("C_LOCAL"))
        b.k("copy_cols", mem("S_DQKV", E(s, "C_LOCAL")), ACT, I("QKV_LOCAL"),
            block("S_RING_DKV", "(CFG_CP % 2)"), F32, IK(2), I("N"), IK(2))
    end

    -- CP_COMM=a2a: an all-to-all over cp trades sequence for heads (docs/megatron.md §12);
    -- a cp rank's head group: CP_HEADS query heads and CPKV kv heads (CPKVW channels)
    local CPKV, CPKVW = llama and "CP_KV" or "CP_HEADS", llama and "CP_KVW" or "CP_HW"
    -- the columns of a row of the whole sequence: q|k|v (qkv) or one output
    local function a2a_width(qkv, x)     -- x: "N" or 1
        if not qkv then return E(s, x, "CP_HW") end
        if not llama then return E(s, x, 3, "CP_HW") end
        return plus(E(s, x, "CP_HW"), E(s, x, 2, "CP_KVW"))
    end
    local function a2a(b, send, recv, qkv, what)
        local w = a2a_width(qkv, "N")
        b.coll("alltoall", "cp", { n = w.value, n_expr = w, dtype = act, send = send,
               recv = recv, text = string.format(">>> all-to-all over cp: %s, head group j " ..
                                                 "to cp rank j (docs/megatron.md §12)", what) })
    end
    local function a2a_heads(b, blocks, rows, qkv, pack)
        b.k("cp_a2a_heads", blocks, rows, I("C_LOCAL"), qkv and IK() or int(E(s, 0)),
            int(E(s, pack)), I("N"), I("CP"), ACT)
    end
    local function a2a_order(b, dst, src, qkv, to_seq)
        b.k("cp_a2a_order", dst, src, int(a2a_width(qkv, 1)), int(E(s, to_seq)), I("N"),
            I("CP"), I("T_CHUNK"), I("B"), ACT)
    end
    local function a2a_fwd(b)
        b.note("attention by head groups (docs/megatron.md §12, CP_COMM=a2a): q|k|v of " ..
               "HEADS_LOCAL/CP heads over the whole sequence, then the output back")
        a2a_heads(b, mem("S_A2A_SEND"), mem("L_QKV"), true, 1)
        a2a(b, mem("S_A2A_SEND"), mem("S_A2A_RECV"), true, "q|k|v")
        a2a_order(b, mem("L_QKV_SEQ"), mem("S_A2A_RECV"), true, 1)
        b.k("attention_fwd", mem("L_ATTY_SEQ"), mem("L_LSE"), mem("L_QKV_SEQ"), I("B"), I("SEQ"),
            I("CP_HEADS"), I(CPKV), I("HEAD_DIM"), num("CFG_ATT_SCALE"), ACT)
        a2a_order(b, mem("S_A2A_SEND"), mem("L_ATTY_SEQ"), false, 0)
        a2a(b, mem("S_A2A_SEND"), mem("S_A2A_RECV"), false, "the attention output")
        a2a_heads(b, mem("S_A2A_RECV"), mem("L_ATTY"), false, 0)
    end
    local function a2a_bwd(b)
        a2a_heads(b, mem("S_A2A_SEND"), mem("S_DATTY"), false, 1)
        a2a(b, mem("S_A2A_SEND"), mem("S_A2A_RECV"), false, "the output gradient")
        a2a_order(b, mem("S_A2A_DOUT"), mem("S_A2A_RECV"), false, 1)
        b.k("attention_bwd", mem("S_A2A_SEND"), mem("S_DSUM"), mem("S_A2A_DOUT"),
            mem("L_ATTY_SEQ"), mem("L_LSE"), mem("L_QKV_SEQ"), I("B"), I("SEQ"), I("CP_HEADS"),
            I(CPKV), I("HEAD_DIM"), num("CFG_ATT_SCALE"), ACT)
        a2a_order(b, mem("S_A2A_RECV"), mem("S_A2A_SEND"), true, 0)
        a2a(b, mem("S_A2A_RECV"), mem("S_A2A_SEND"), true, "dq|dk|dv")
        a2a_heads(b, mem("S_A2A_SEND"), mem("S_DQKV"), true, 0)
    end

    local function attention_core(b)
        if cfg.cp > 1 then
            if cfg.cp_comm == "a2a" then a2a_fwd(b) else ring_fwd(b) end
            return
        end
        b.k("attention_fwd", mem("L_ATTY"), mem("L_LSE"), mem("L_QKV"), I("B"), I("T"),
            I("HEADS_LOCAL"), I(KVH), I("HEAD_DIM"), num("CFG_ATT_SCALE"), ACT)
    end
    local function attention_core_bwd(b)
        if cfg.cp > 1 then
            if cfg.cp_comm == "a2a" then a2a_bwd(b) else ring_bwd(b) end
            return
        end
        b.k("attention_bwd", mem("S_DQKV"), mem("S_DSUM"), mem("S_DATTY"), mem("L_ATTY"),
            mem("L_LSE"), mem("L_QKV"), I("B"), I("T"), I("HEADS_LOCAL"), I(KVH),
            I("HEAD_DIM"), num("CFG_ATT_SCALE"), ACT)
    end

    -- -- The dense MLP (or the shared expert beside the routed ones) -------------------------

    local function mlp_up(b, h)
        if llama then        -- fc = [h . gate^T | h . up^T], gelu := silu(gate) * up
            b.k("linear_fwd", mem("L_FC"), I(2, "FF_LOCAL"), h, param("FC_W"), I("N"), I("C"),
                I("FF_LOCAL"), ACT)
            b.k("linear_fwd", mem("L_FC", E(s, "FF_LOCAL")), I(2, "FF_LOCAL"), h, param("UP_W"),
                I("N"), I("C"), I("FF_LOCAL"), ACT)
            b.k("swiglu_fwd", mem("L_GELU"), mem("L_FC"), I("N"), I("FF_LOCAL"), ACT)
        else
            b.k("matmul_gelu_fwd", mem("L_FC"), mem("L_GELU"), h, param("FC_W"),
                w_or_null("FC_B"), I("N"), I("C"), I("FF_LOCAL"), ACT)
        end
    end
    -- the buffer with this rank's (N_SP, C) rows of the MLP's output
    local function mlp_fwd(b)
        local h = gather_seq(b, mem("L_LN2"), "S_GATHER", "ln_2's output")
        mlp_up(b, h)
        if llama then
            b.k("linear_fwd", mem("S_FULL"), I("C"), mem("L_GELU"), param("MLP_PROJ_W"), I("N"),
                I("FF_LOCAL"), I("C"), ACT)
        else
            b.k("matmul_fwd", mem("S_FULL"), mem("L_GELU"), param("MLP_PROJ_W"),
                row_bias_in_product("MLP_PROJ_B") and param("MLP_PROJ_B") or NULL, I("N"),
                I("FF_LOCAL"), I("C"), ACT)
        end
        local proj = reduce_seq(b, mem("S_FULL"), "the MLP's output")
        if has("MLP_PROJ_B") and not row_bias_in_product("MLP_PROJ_B") then
            -- the row-parallel bias, after the sum
            b.k("bias_fwd", proj, param("MLP_PROJ_B"), I("N_SP"), I("C"), ACT)
        end
        return proj
    end
    -- backward of mlp_fwd for dout (N_SP, C): the buffer with d(ln_2's output)
    local function mlp_bwd(b, dout)
        local h = gather_seq(b, mem("L_LN2"), "S_GATHER", "ln_2's output again")
        if rc.mlp then
            b.note("selective recompute (mlp): its first half again (docs/megatron.md §9.2)")
            mlp_up(b, h)
        end
        if has("MLP_PROJ_B") then
            b.k("bias_bwd", grad("MLP_PROJ_B"), dout, I("N_SP"), I("C"), ACT)
        end
        local dd = gather_seq(b, dout, "S_FULL", "the output gradient")
        if llama then
            b.k("linear_bwd", mem("S_DACT"), lit("0.0f"), grad("MLP_PROJ_W"), dd, I("C"),
                mem("L_GELU"), param("MLP_PROJ_W"), I("N"), I("FF_LOCAL"), I("C"), ACT)
            b.k("swiglu_bwd", mem("S_DFC"), mem("S_DACT"), mem("L_FC"), I("N"), I("FF_LOCAL"),
                ACT)
            b.k("linear_bwd", mem("S_FULL"), lit("0.0f"), grad("FC_W"), mem("S_DFC"),
                I(2, "FF_LOCAL"), h, param("FC_W"), I("N"), I("C"), I("FF_LOCAL"), ACT)
            b.k("linear_bwd", mem("S_FULL"), lit("1.0f"), grad("UP_W"),
                mem("S_DFC", E(s, "FF_LOCAL")), I(2, "FF_LOCAL"), h, param("UP_W"), I("N"),
                I("C"), I("FF_LOCAL"), ACT)
        else
            b.k("matmul_bwd_gelu", mem("S_DFC"), grad("MLP_PROJ_W"), dd, mem("L_GELU"),
                param("MLP_PROJ_W"), mem("L_FC"), I("N"), I("FF_LOCAL"), I("C"), ACT)
            b.k("matmul_bwd", mem("S_FULL"), grad("FC_W"), g_or_null("FC_B"), mem("S_DFC"), h,
                param("FC_W"), I("N"), I("C"), I("FF_LOCAL"), ACT)
        end
        return reduce_seq(b, mem("S_FULL"), "the input gradient")
    end

    -- -- The mixture of experts (docs/megatron.md §8) ----------------------------------------

    local MOE, W, DW = ident("m"), ident("w"), ident("dw")
    local counts = mem("MS_COUNTS")
    local G_AUX = cfg.cp > 1 and "tp-cp" or "tp"     -- the aux loss's tokens
    -- rows an all-to-all moves per peer with a balanced load (for make inspect), and what it
    -- moves in the report's words (a probabilities' exchange adds to the rows' before it)
    local load = M.moe_load(cfg, s) or {}
    local WHAT = { fwd = { EP_ROWS = "rows + probs out", EP_BACK = "outputs back",
                           ETP_ROWS = "rows + probs", ETP_SUM = "partial outputs" },
                   bwd = { EP_ROWS = "output grads out", ETP_ROWS = "output grads",
                           ETP_SUM = "input + prob grads", EP_BACK = "input + prob grads back" } }
    local pass = "fwd"
    local function a2av(b, group, send, recv, dtype, which, width, text)
        local per = group == "ep" and load.rows_ep or load.rows_etp
        b.coll("alltoallv", group, { dtype = dtype, send = send, recv = recv, a2a = which,
               rows = per, width = width, what = WHAT[pass][which], text = text })
    end
    local function moe_fwd(b, x, out)
        pass = "fwd"
        b.note("the router: logits, top-k, probabilities; the aux loss's token counts of this " ..
               "rank's tokens (docs/megatron.md §8.1)")
        b.k("moe_router_fwd", MOE, W, x, counts)
        if cfg.tp * cfg.cp > 1 then
            b.coll("allgather", G_AUX, { n = s.E * s.aux_seqs, n_expr = E(s, "EXPERTS",
                   "AUX_SEQS"), dtype = "i32", send = counts,
                   recv = mem("MS_COUNTS", E(s, "EXPERTS", "AUX_SEQS")),
                   text = string.format(">>> all-gather over %s: every sequence shard's token " ..
                                        "counts per expert, for the aux loss " ..
                                        "(docs/megatron.md §8.1)", G_AUX) })
        end
        b.k("moe_dispatch", MOE, W, x, counts, ident("again"))
        local xs, ps = mem("MS_XS"), mem("MS_PS")
        if cfg.ep > 1 then
            b.coll("alltoallv", "ep", { dtype = "i32", send = counts,
                   recv = mem("MS_COUNTS", E(s, "EP", "EXPERTS_LOCAL")), a2a = "EP_COUNTS",
                   n = cfg.ep * s.nl, text = ">>> all-to-all over ep: how many rows go to " ..
                   "each (peer, local expert) (docs/megatron.md §8.2)" })
            b.k("moe_recv_plan", MOE, counts)
            a2av(b, "ep", xs, mem("MS_XR"), act, "EP_ROWS", s.C, ">>> all-to-all over ep: " ..
                 "the kept rows to their experts' ranks (docs/megatron.md §8.2)")
            a2av(b, "ep", ps, mem("MS_PR"), "f32", "EP_PROBS", 1, ">>> all-to-all over ep: " ..
                 "their probabilities")
            xs, ps = mem("MS_XR"), mem("MS_PR")
        end
        if cfg.etp > 1 then
            b.coll("allgather", "expt-tp", { n = cfg.ep * s.nl, n_expr = E(s, "EP",
                   "EXPERTS_LOCAL"), dtype = "i32", send = counts,
                   recv = mem("MS_COUNTS", E(s, "EP", "EXPERTS_LOCAL")),
                   text = ">>> all-gather over expt-tp: the rows each member received, per " ..
                          "(peer, local expert) (docs/megatron.md §8.3)" })
            b.k("moe_member_plan", MOE, counts)
            a2av(b, "expt-tp", xs, mem("MS_XG"), act, "ETP_ROWS", s.C, ">>> all-gather over " ..
                 "expt-tp (an all-to-all of each member's rows): every member computes its " ..
                 "slice of every expert for all of them (docs/megatron.md §8.3)")
            a2av(b, "expt-tp", ps, mem("MS_PG"), "f32", "ETP_PROBS", 1, ">>> all-gather over " ..
                 "expt-tp: their probabilities")
            xs, ps = mem("MS_XG"), mem("MS_PG")
        end
        b.k("moe_experts_fwd", MOE, W, xs, ps)
        local y = mem("MS_YG")
        if cfg.etp > 1 then
            a2av(b, "expt-tp", y, mem("MS_XG"), act, "ETP_SUM", s.C, ">>> reduce-scatter over " ..
                 "expt-tp (an all-to-all, then the sum): each member's rows get every " ..
                 "member's partial outputs (docs/megatron.md §8.3)")
            b.k("moe_sum_members", MOE, mem("MS_YR"), mem("MS_XG"), I("C"), ACT)
            y = mem("MS_YR")
        end
        if cfg.ep > 1 then
            a2av(b, "ep", y, mem("MS_YS"), act, "EP_BACK", s.C, ">>> all-to-all over ep: the " ..
                 "outputs back to their tokens' ranks (docs/megatron.md §8.2)")
            y = mem("MS_YS")
        end
        b.k("moe_combine", MOE, out, y)
    end
    local function moe_bwd(b, x, dout, dx)
        pass = "bwd"
        b.note("the experts' backward: each kept row's output gradient, the way its token went")
        b.k("moe_bwd_rows", MOE, dout)
        local dy = mem("MS_YS")
        if cfg.ep > 1 then
            a2av(b, "ep", dy, mem("MS_YR"), act, "EP_ROWS", s.C, ">>> all-to-all over ep: the " ..
                 "output gradients to the experts' ranks (docs/megatron.md §8.2)")
            dy = mem("MS_YR")
        end
        if cfg.etp > 1 then
            a2av(b, "expt-tp", dy, mem("MS_YG"), act, "ETP_ROWS", s.C, ">>> all-gather over " ..
                 "expt-tp (an all-to-all): the output gradients of every member's rows, the " ..
                 "backward of the forward's reduce-scatter")
            dy = mem("MS_YG")
        end
        b.k("moe_experts_bwd", MOE, W, DW, dy)
        local dxr, dpr = mem("MS_YG"), mem("MS_DPG")
        if cfg.etp > 1 then
            a2av(b, "expt-tp", dxr, mem("MS_XG"), act, "ETP_SUM", s.C, ">>> reduce-scatter " ..
                 "over expt-tp (an all-to-all, then the sum): the input gradients' partials " ..
                 "of every member's rows (docs/megatron.md §8.3)")
            b.k("moe_sum_members", MOE, mem("MS_YR"), mem("MS_XG"), I("C"), ACT)
            a2av(b, "expt-tp", dpr, mem("MS_DPE"), "f32", "ETP_SUM_PROBS", 1, ">>> " ..
                 "reduce-scatter over expt-tp: the probability gradients' partials")
            b.k("moe_sum_members", MOE, mem("MS_DPR"), mem("MS_DPE"), I(1), F32)
            dxr, dpr = mem("MS_YR"), mem("MS_DPR")
        end
        if cfg.ep > 1 then
            a2av(b, "ep", dxr, mem("MS_YS"), act, "EP_BACK", s.C, ">>> all-to-all over ep: the " ..
                 "input gradients back to their tokens' ranks (docs/megatron.md §8.2)")
            a2av(b, "ep", dpr, mem("MS_DPS"), "f32", "EP_BACK_PROBS", 1, ">>> all-to-all " ..
                 "over ep: the probability gradients back")
            dxr, dpr = mem("MS_YS"), mem("MS_DPS")
        end
        b.note("the router's backward: through the top-k and the aux loss, then its GEMMs")
        b.k("moe_router_bwd", MOE, W, DW, x, dxr, dpr, dx)
    end
    -- res2 = res1 [+ shared(ln_2)] + moe(ln_2); the shared expert's collectives come first
    local function moe_branch_fwd(b)
        if s.shared then
            b.note("the shared expert: the dense MLP on every token (docs/megatron.md §8.1)")
            b.k("add_fwd", mem("L_RES2"), mem("L_RES1"), mlp_fwd(b), int(ROWS), ACT)
        end
        moe_fwd(b, mem("L_LN2"), mem("S_FULL_SP"))
        if s.shared then
            b.k("add_inplace", mem("L_RES2"), mem("S_FULL_SP"), int(ROWS), ACT)
        else
            b.k("add_fwd", mem("L_RES2"), mem("L_RES1"), mem("S_FULL_SP"), int(ROWS), ACT)
        end
    end
    local function moe_branch_bwd(b, dres)
        if not s.shared then
            moe_bwd(b, mem("L_LN2"), dres, mem("S_FULL_SP"))
            return mem("S_FULL_SP")
        end
        moe_bwd(b, mem("L_LN2"), dres, mem("S_DSHARED"))
        b.note("the shared expert's backward")
        local dd = mlp_bwd(b, dres)
        b.k("add_inplace", dd, mem("S_DSHARED"), int(ROWS), ACT)
        return dd
    end

    -- -- The transformer layer ---------------------------------------------------------------

    local X, DRES = ident("x"), ident("dres")
    local QN = E(s, "HEADS_LOCAL", "HEAD_DIM")            -- Llama: q's columns, k's, v's
    local KVN = E(s, "KV_LOCAL", "HEAD_DIM")
    -- Llama: rotary positions on the q and k heads of q|k|v (id: L_QKV, or its gradient
    -- S_DQKV), chunk by chunk at their true positions (two chunks under context parallelism)
    local function rope_qk(b, id, inverse)
        for t = 0, s.T - 1, s.t_chunk do
            local at = t > 0 and E(s, t, "B", "QKV_LOCAL") or nil
            local pos = lit(string.format("gpt_cp_position(%d)", t))
            b.k("rope_fwd", mem(id, at), I("QKV_LOCAL"), I("T_CHUNK"), I("B"),
                I("HEADS_LOCAL"), I("HEAD_DIM"), pos, num("CFG_ROPE_THETA"), int(E(s, inverse)),
                ACT)
            b.k("rope_fwd", mem(id, at and plus(at, QN) or QN), I("QKV_LOCAL"),
                I("T_CHUNK"), I("B"),
                I("KV_LOCAL"), I("HEAD_DIM"), pos, num("CFG_ROPE_THETA"), int(E(s, inverse)),
                ACT)
        end
    end
    local function qkv_fwd(b, h)
        if not llama then
            b.k("matmul_fwd", mem("L_QKV"), h, param("QKV_W"), w_or_null("QKV_B"), I("N"),
                I("C"), I("QKV_LOCAL"), ACT)
            return
        end
        b.k("linear_fwd", mem("L_QKV"), I("QKV_LOCAL"), h, param("QKV_W"), I("N"), I("C"),
            int(QN), ACT)
        b.k("linear_fwd", mem("L_QKV", QN), I("QKV_LOCAL"), h, param("K_W"), I("N"), I("C"),
            int(KVN), ACT)
        b.k("linear_fwd", mem("L_QKV", plus(QN, KVN)), I("QKV_LOCAL"), h, param("V_W"),
            I("N"), I("C"), int(KVN), ACT)
        rope_qk(b, "L_QKV", 0)
    end
    local function attn_proj_fwd(b)
        if llama then
            b.k("linear_fwd", mem("S_FULL"), I("C"), mem("L_ATTY"), param("ATTN_PROJ_W"), I("N"),
                I("C_LOCAL"), I("C"), ACT)
        else
            b.k("matmul_fwd", mem("S_FULL"), mem("L_ATTY"), param("ATTN_PROJ_W"),
                row_bias_in_product("ATTN_PROJ_B") and param("ATTN_PROJ_B") or NULL, I("N"),
                I("C_LOCAL"), I("C"), ACT)
        end
    end

    -- x (N_SP, C) -> res2 (N_SP, C): x + attention(norm(x)), then + mlp(norm(.)) or the
    -- mixture of experts
    local function layer_fwd()
        local b = builder()
        b.note(string.format("attention: res1 = x + %s", llama and
               "o_proj(attention(rope(q|k|v(rmsnorm(x)))))" or
               "c_proj(attention(c_attn(ln_1(x))))"))
        ln1_fwd(b, X)
        local h = gather_seq(b, mem("L_LN1"), "S_GATHER", "ln_1's output")
        qkv_fwd(b, h)
        attention_core(b)
        attn_proj_fwd(b)
        local proj = reduce_seq(b, mem("S_FULL"), "the attention's output")
        if has("ATTN_PROJ_B") and not row_bias_in_product("ATTN_PROJ_B") then
            -- the row-parallel bias, after the sum
            b.k("bias_fwd", proj, param("ATTN_PROJ_B"), I("N_SP"), I("C"), ACT)
        end
        add_ln2_fwd(b, X, proj)
        if moe then
            b.note("res2 = res1 + the mixture of experts of ln_2's output")
            moe_branch_fwd(b)
        else
            b.note(llama and "MLP: res2 = res1 + down(silu(gate) * up) of ln_2's output" or
                   "MLP: res2 = res1 + c_proj(gelu(c_fc(ln_2(res1))))")
            b.k("add_fwd", mem("L_RES2"), mem("L_RES1"), mlp_fwd(b), int(ROWS), ACT)
        end
        return b.stmts
    end

    -- dres (N_SP, C) holds d(res2) on entry and d(x) on return (each branch adds its input
    -- gradient to the residual stream); gradients accumulate
    local function layer_bwd()
        local b = builder()
        if rc.layernorm then
            b.note("selective recompute (layernorm): ln_2 again (docs/megatron.md §9.2)")
            ln2_fwd(b)
        end
        local dd
        if moe then dd = moe_branch_bwd(b, DRES)
        else
            b.note("MLP backward")
            dd = mlp_bwd(b, DRES)
        end
        norm_bwd(b, DRES, "LN2_W", "LN2_B", dd, mem("L_RES1"), "L_LN2_MEAN", "L_LN2_RSTD")
        b.note("attention backward")
        if rc.layernorm then ln1_fwd(b, X) end
        local h = gather_seq(b, mem("L_LN1"), "S_GATHER", "ln_1's output again")
        if rc.core_attn then
            b.note("selective recompute (core_attn): the attention core again " ..
                   "(docs/megatron.md §9.2)")
            attention_core(b)
        end
        if has("ATTN_PROJ_B") then
            b.k("bias_bwd", grad("ATTN_PROJ_B"), DRES, I("N_SP"), I("C"), ACT)
        end
        local dout = gather_seq(b, DRES, "S_FULL", "the output gradient")
        if llama then
            b.k("linear_bwd", mem("S_DATTY"), lit("0.0f"), grad("ATTN_PROJ_W"), dout, I("C"),
                mem("L_ATTY"), param("ATTN_PROJ_W"), I("N"), I("C_LOCAL"), I("C"), ACT)
        else
            b.k("matmul_bwd", mem("S_DATTY"), grad("ATTN_PROJ_W"), NULL, dout, mem("L_ATTY"),
                param("ATTN_PROJ_W"), I("N"), I("C_LOCAL"), I("C"), ACT)
        end
        attention_core_bwd(b)
        if llama then
            rope_qk(b, "S_DQKV", 1)
            b.k("linear_bwd", mem("S_FULL"), lit("0.0f"), grad("QKV_W"), mem("S_DQKV"),
                I("QKV_LOCAL"), h, param("QKV_W"), I("N"), I("C"), int(QN), ACT)
            b.k("linear_bwd", mem("S_FULL"), lit("1.0f"), grad("K_W"), mem("S_DQKV", QN),
                I("QKV_LOCAL"), h, param("K_W"), I("N"), I("C"), int(KVN), ACT)
            b.k("linear_bwd", mem("S_FULL"), lit("1.0f"), grad("V_W"),
                mem("S_DQKV", plus(QN, KVN)), I("QKV_LOCAL"), h, param("V_W"), I("N"), I("C"),
                int(KVN), ACT)
        else
            b.k("matmul_bwd", mem("S_FULL"), grad("QKV_W"), g_or_null("QKV_B"), mem("S_DQKV"),
                h, param("QKV_W"), I("N"), I("C"), I("QKV_LOCAL"), ACT)
        end
        dd = reduce_seq(b, mem("S_FULL"), "the input gradient")
        norm_bwd(b, DRES, "LN1_W", "LN1_B", dd, X, "L_LN1_MEAN", "L_LN1_RSTD")
        return b.stmts
    end

    -- -- Embedding and head ------------------------------------------------------------------

    local TOK, OUT = ident("tok"), ident("out")
    -- tokens -> x (N_SP, C): wte[tok] + wpe[position] (docs/megatron.md §4.4)
    local function embedding_fwd()
        local b = builder()
        local full = cfg.sp and mem("S_FULL") or OUT
        b.k("rt_memcpy_async", TOK, lit("gpt_inputs(mb)"), I("N", "sizeof(int)"), lit("RT_H2D"))
        b.k("embed_fwd", full, TOK, param("WTE"), I("N"), I("C"), lit("gpt_vocab_start()"),
            I("V_LOCAL"), ACT)
        if cfg.tp > 1 then
            b.coll("allreduce", "tp", { n = s.N * s.C, n_expr = E(s, "N", "C"), dtype = act,
                   red = "sum", send = full, text = ">>> all-reduce over tp: each rank looked " ..
                   "up the tokens of its vocabulary rows (docs/megatron.md §4.4)" })
        end
        if not llama then            -- Llama: rotary positions, in the layers
            for t = 0, s.T - 1, s.t_chunk do
                b.k("pos_fwd", ir.Arg { kind = full.kind, id = full.id,
                                        off = t > 0 and E(s, t, "B", "C") or nil },
                    param("WPE"), I("T_CHUNK"), I("B"), I("C"),
                    lit(string.format("gpt_cp_position(%d)", t)), ACT)
            end
        end
        if cfg.sp then
            b.note("scatter to the sequence-parallel region: keep this rank's rows")
            b.k("rt_memcpy", OUT, mem("S_FULL", E(s, "gpt_tp_rank()", "N_SP", "C")),
                I("N_SP", "C", "ACT_SIZE"), lit("RT_D2D"))
        end
        return b.stmts
    end
    local DY = ident("dy")
    local function embedding_bwd()
        local b = builder()
        local dd = gather_seq(b, DY, "S_FULL", "the output gradient")
        b.k("embed_bwd", grad("WTE"), dd, TOK, I("N"), I("C"), lit("gpt_vocab_start()"),
            I("V_LOCAL"), ACT)
        if not llama then
            for t = 0, s.T - 1, s.t_chunk do
                b.k("pos_bwd", grad("WPE"), ir.Arg { kind = dd.kind, id = dd.id,
                                                     off = t > 0 and E(s, t, "B", "C") or nil },
                    I("T_CHUNK"), I("B"), I("C"), lit(string.format("gpt_cp_position(%d)", t)),
                    ACT)
            end
        end
        return b.stmts
    end
    -- ln_f, logits over this rank's vocabulary rows, vocabulary-parallel cross-entropy
    -- (docs/megatron.md §4.5, in f32 from the logits) and, fused, its backward: dx (N_SP, C)
    -- gets d(loss)/d(x) for the micro-batch's share 1/(N*NMB) of the step's mean loss
    local function head()
        local b = builder()
        local CE = function(k) return mem("S_CE", k > 0 and E(s, k, "N") or nil) end
        local HEAD_W = "HEAD_WTE"        -- the head's weight: tied (wte or its copy) or lm_head
        b.k("rt_memcpy_async", mem("S_TARGETS"), lit("gpt_targets(mb)"), I("N", "sizeof(int)"),
            lit("RT_H2D"))
        norm_fwd(b, mem("H_LNF"), "H_LNF_MEAN", "H_LNF_RSTD", X, "LN_F_W", "LN_F_B")
        local h = gather_seq(b, mem("H_LNF"), "S_FULL", "ln_f's output")
        b.k("linear_fwd", mem("S_LOGITS"), I("V_LOCAL"), h, param(HEAD_W), I("N"), I("C"),
            I("V_LOCAL"), ACT)
        if cfg.tp == 1 then
            b.note("one rank owns the vocabulary: loss and, in place, dlogits = (softmax - " ..
                   "onehot) * DLOSS, one kernel (docs/megatron.md §4.5)")
            b.k("ce_fused", CE(3), CE(0), CE(1), mem("S_LOGITS"), mem("S_TARGETS"), I("N"),
                I("V_LOCAL"), lit("gpt_vocab_valid()"), lit("gpt_vocab_start()"),
                num("CFG_DLOSS"), ACT)
            b.k("sum_rows", ident("loss"), CE(3), I("N"))
        else
            b.k("ce_rowmax", CE(0), mem("S_LOGITS"), I("N"), I("V_LOCAL"),
                lit("gpt_vocab_valid()"), ACT)
            b.coll("allreduce", "tp", { n = s.N, n_expr = E(s, "N"), dtype = "f32", red = "max",
                   send = CE(0), text = ">>> all-reduce MAX over tp: the row maxima over the " ..
                   "whole vocabulary (docs/megatron.md §4.5)" })
            b.k("ce_sums", CE(1), mem("S_LOGITS"), CE(0), mem("S_TARGETS"), I("N"), I("V_LOCAL"),
                lit("gpt_vocab_valid()"), lit("gpt_vocab_start()"), ACT)
            b.coll("allreduce", "tp", { n = 2 * s.N, n_expr = E(s, 2, "N"), dtype = "f32",
                   red = "sum", send = CE(1), text = ">>> all-reduce over tp: [sum of exp | " ..
                   "the target's logit] (its owner's) (docs/megatron.md §4.5)" })
            b.k("ce_loss", CE(3), CE(1), CE(0), I("N"))
            b.k("sum_rows", ident("loss"), CE(3), I("N"))
            b.note("backward: dlogits = (softmax - onehot) * DLOSS, in place; no " ..
                   "communication (docs/megatron.md §4.5)")
            b.k("ce_bwd", mem("S_LOGITS"), CE(0), CE(1), mem("S_TARGETS"), I("N"),
                I("V_LOCAL"), lit("gpt_vocab_valid()"), lit("gpt_vocab_start()"),
                num("CFG_DLOSS"), ACT)
        end
        b.k("linear_bwd", mem("S_FULL"), lit("0.0f"), grad(HEAD_W), mem("S_LOGITS"),
            I("V_LOCAL"), h, param(HEAD_W), I("N"), I("C"), I("V_LOCAL"), ACT)
        local dh = reduce_seq(b, mem("S_FULL"), "the input gradient")
        b.k("rt_memset0", DY, I("N_SP", "C", "ACT_SIZE"))
        norm_bwd(b, DY, "LN_F_W", "LN_F_B", dh, X, "H_LNF_MEAN", "H_LNF_RSTD")
        return b.stmts
    end

    local function code(name, stmts)
        return ir.Code { name = name, stmts = stmts, comm = M.comm(stmts) }
    end
    return ir.LayerProgram {
        embedding_fwd = code("embedding_fwd", embedding_fwd()),
        embedding_bwd = code("embedding_bwd", embedding_bwd()),
        layer_fwd = code("layer_fwd", layer_fwd()),
        layer_bwd = code("layer_bwd", layer_bwd()),
        head = code("head_fwd_bwd", head()),
    }
end

return M
