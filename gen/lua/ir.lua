-- ir.lua: the records handed between passes, each declared once with its fields (a small
-- version of Terra's ASDL). Read this first: it is the contract between config, topology,
-- partition, shards, inspect and emit (and the later schedule/program passes).
--
-- M.Name{...} checks every declared field's type, rejects undeclared ones, and returns the
-- table as a record; reading an undeclared field of a record is an error (typos fail loudly).
-- Types: int, num, str, bool, any, array (a Lua sequence), map (string-keyed table), a record name;
-- a trailing "?" makes the field optional. All indices and ranks stored here are 0-based, as
-- in Megatron and in the JSON files; Lua arrays themselves are 1-based.

local M = {}

local registry = {}     -- record name -> { mt = metatable, fields = {...} }

-- The check of a value of type 'ty' (a function of the value), made once per declared field:
-- records are built by the hundred thousand (schedules), so the constructor does no string
-- comparison of type names per value.
local math_type = math.type
local CHECKS = {
    int = function(v) return math_type(v) == "integer" end,
    num = function(v) return type(v) == "number" end,
    str = function(v) return type(v) == "string" end,
    bool = function(v) return type(v) == "boolean" end,
    array = function(v) return type(v) == "table" end,
    map = function(v) return type(v) == "table" end,
    any = function() return true end,
}
local function checker(ty)
    return CHECKS[ty] or function(v)
        local rec = registry[ty]
        return rec ~= nil and getmetatable(v) == rec.mt
    end
end

local function record(name, spec)
    local fields, types, optional, arrays = {}, {}, {}, {}
    for i, f in ipairs(spec) do
        local field, ty = f[1], f[2]
        local opt = ty:sub(-1) == "?"
        if opt then ty = ty:sub(1, -2) end
        fields[i], types[field], optional[field] = field, ty, opt
        if ty == "array" then arrays[field] = true end
    end
    local mt = { __name = name, __fields = fields, __arrays = arrays, __doc = spec }
    mt.__index = function(_, k)
        if types[k] then return nil end
        error(string.format("ir: %s has no field '%s'", name, tostring(k)), 2)
    end
    mt.__newindex = function(t, k, v)
        if not types[k] then
            error(string.format("ir: %s has no field '%s'", name, tostring(k)), 2)
        end
        rawset(t, k, v)
    end
    registry[name] = { mt = mt, fields = fields }
    local checks, nfields = {}, #fields
    for i, field in ipairs(fields) do checks[i] = checker(types[field]) end
    M[name] = function(t)
        for k in pairs(t) do
            if not types[k] then
                error(string.format("ir: %s has no field '%s'", name, tostring(k)), 2)
            end
        end
        for i = 1, nfields do
            local field = fields[i]
            local v = t[field]
            if v == nil then
                if not optional[field] then
                    error(string.format("ir: %s.%s is required", name, field), 2)
                end
            elseif not checks[i](v) then
                error(string.format("ir: %s.%s must be %s, got %s (%s)", name, field,
                                    types[field], tostring(v), math.type(v) or type(v)), 2)
            end
        end
        return setmetatable(t, mt)
    end
end

-- The declared field names of record 'v' in order, or nil if 'v' is not a record.
function M.fields(v)
    local mt = getmetatable(v)
    return mt and mt.__fields
end

-- Set of the fields of record 'v' declared as arrays (so JSON writes [] when empty).
function M.array_fields(v)
    local mt = getmetatable(v)
    return mt and mt.__arrays
end

-- -- Model description (config.lua, from models/<name>.lua) -------------------------------

record("Moe", {
    { "experts",         "int",  "number of experts per MoE layer (E_total)" },
    { "top_k",           "int",  "experts chosen per token" },
    { "ffn_hidden",      "int",  "hidden size of each expert's MLP (default: the model's)" },
    { "aux_loss_coeff",  "num",  "load-balancing loss coefficient (default 0)" },
    { "z_loss_coeff",    "num",  "router z-loss coefficient (default 0)" },
    { "topk_scaling_factor", "num?", "factor of the chosen probabilities; nil = none" },
    { "score_function",  "str",  "softmax (default) or sigmoid" },
    { "num_groups",      "int?", "group-limited routing: expert groups; nil = none" },
    { "group_topk",      "int?", "group-limited routing: groups a token may use" },
    { "load_balancing",  "str",  "aux_loss (per micro-batch; default), seq_aux_loss (per " ..
                                 "sequence, averaged) or none" },
    { "pre_softmax",     "bool", "softmax over all experts before top-k (default false)" },
    { "capacity_factor", "num?", "token capacity factor; nil = no dropping" },
    { "drop_policy",     "str",  "which choices an expert keeps beyond the capacity: probs " ..
                                 "(the highest probabilities; default) or position (the " ..
                                 "earliest rows)" },
    { "pad_to_capacity", "bool", "every expert gets exactly its capacity of rows, padded " ..
                                 "with zero-probability rows (default false)" },
    { "expert_bias",     "bool", "aux-loss-free load balancing: a per-layer expert bias " ..
                                 "added to the scores for the top-k only (default false)" },
    { "bias_update_rate", "num", "the expert bias's step per optimizer step (default 1e-3)" },
    { "shared_expert_ffn", "int?", "width of the shared expert, a dense MLP on every token " ..
                                   "added to the routed output (Megatron's " ..
                                   "moe_shared_expert_intermediate_size); nil = none" },
    { "bias",            "bool", "router and expert biases = the model's bias (needs ETP 1)" },
    { "line",            "int",  "line of the moe{ } call in the model file" },
    { "lines",           "map",  "key -> line of that key in the model file" },
})

record("Model", {
    { "name",        "str",  "model name: the file name without .lua (gpt3_175b)" },
    { "file",        "str",  "the file as named on the command line (models/gpt3_175b.lua)" },
    { "line",        "int",  "line of the gpt{ } call" },
    { "lines",       "map",  "key -> line of that key (for errors tying a value to a size)" },
    { "description", "str?", "free text from the file" },
    { "layers",      "int",  "transformer layers (L)" },
    { "hidden",      "int",  "model width (C)" },
    { "heads",       "int",  "attention heads" },
    { "head_dim",    "int",  "hidden // heads" },
    { "seq_len",     "int",  "maximum sequence length = rows of wpe (T)" },
    { "vocab",       "int",  "vocabulary size before padding (V)" },
    { "ffn_hidden",  "int",  "MLP hidden size (default 4*hidden)" },
    { "norm_eps",    "num",  "LayerNorm epsilon (default 1e-5)" },
    { "init_std",    "num",  "init standard deviation (default 0.02)" },
    { "vocab_pad",   "int",  "pad vocab to a multiple of vocab_pad*TP (default 128)" },
    { "moe",         "Moe?", "mixture of experts in every MLP; nil = dense" },
    { "bias",        "bool", "linear layers have biases (gpt: add_bias_linear, default true; " ..
                             "llama: false)" },
    { "arch",        "str",  "gpt (GPT-2: LayerNorm, GELU, learned positions, biases) or " ..
                             "llama (RMSNorm, SwiGLU, rotary positions, no biases)" },
    { "kv_heads",    "int",  "key/value heads (grouped-query attention); = heads for gpt" },
    { "rope_theta",  "num?", "llama: the rotary embedding's base; nil for gpt" },
    { "tie_embeddings", "bool", "the LM head is the embedding (gpt: always; llama: default " ..
                                "false)" },
})

-- -- Validated configuration (config.lua) --------------------------------------------------

record("Config", {
    { "model",        "Model", "the model description" },
    { "tp",           "int",   "tensor parallel (T)" },
    { "pp",           "int",   "pipeline stages (P)" },
    { "dp",           "int",   "data parallel, without CP (D)" },
    { "cp",           "int",   "context parallel (C)" },
    { "cp_comm",      "str",   "context-parallel attention: p2p (K|V around the ring) or a2a" },
    { "ep",           "int",   "expert parallel (E)" },
    { "etp",          "int",   "expert tensor parallel (Te, default T)" },
    { "edp",          "int",   "expert data parallel, derived: world / (Te*E*P)" },
    { "vp",           "int",   "virtual pipeline chunks per stage (V)" },
    { "world",        "int",   "T*C*D*P = Te*E*EDP*P" },
    { "order",        "str",   "rank order as given, lower case (tp-cp-ep-dp-pp)" },
    { "axes",         "array", "order with size-1 axes Megatron appends: 5 names" },
    { "first_layers", "int?",  "layers on the first stage (uneven split); nil = even" },
    { "last_layers",  "int?",  "layers on the last stage (uneven split); nil = even" },
    { "account_embedding", "bool", "the even split counts the embedding as a layer of " ..
                                   "(stage 0, chunk 0) (Megatron's account_for_embedding_" ..
                                   "in_pipeline_split)" },
    { "account_loss", "bool",  "the even split counts the loss as a layer of the last chunk" },
    { "layout",       "str?",  "Megatron's pipeline_model_parallel_layout as given " ..
                               "(\"E|t*4|t*4|L\"); nil = the split above" },
    { "mb_group",     "int?",  "interleaved schedule: micro-batches per group (N, default " ..
                               "P); nil without it" },
    { "mbs",          "int",   "micro-batch size" },
    { "nmb",          "int",   "micro-batches per step (M)" },
    { "seq",          "int",   "training sequence length (<= model.seq_len)" },
    { "sp",           "bool",  "sequence parallelism" },
    { "dist_opt",     "bool",  "distributed optimizer" },
    { "bf16",         "bool",  "bf16 mixed precision: bf16 parameters, activations and " ..
                               "communication; fp32 main weights, gradients, optimizer" },
    { "overlap",      "bool",  "communication overlapped with computation (default): the " ..
                               "data-parallel reductions started as each bucket is ready, the " ..
                               "parameter all-gathers waited at their first use; false: each " ..
                               "started where it is waited (the same numbers)" },
    { "bucket_size",  "int?",  "with overlap: a new gradient bucket once a bucket holds this " ..
                               "many elements, on pipeline stage 0's first chunk (Megatron's " ..
                               "--ddp-bucket-size, default max(40M, 1M * DP * CP)); nil: one " ..
                               "bucket per buffer" },
    { "recompute",    "str",   "activation recompute: none, selective or full" },
    { "recompute_method", "str?", "full: uniform or block" },
    { "recompute_layers", "int?", "full: layers per group (uniform), per chunk (block)" },
    { "recompute_modules", "array", "selective: what is recomputed (core_attn, layernorm, mlp)" },
    { "vocab_padded", "int",   "vocab rounded up to a multiple of vocab_pad*T" },
    { "rank",         "int?",  "the rank --inspect --rank asks about" },
    { "dirname",      "str",   "output directory name (DESIGN 4.3)" },
    { "outdir",       "str",   "output directory: out/<dirname> or --out" },
    { "make",         "str",   "the make command that regenerates this output" },
})

-- -- Topology (topology.lua) ----------------------------------------------------------------

record("Grid", {
    { "name",    "str",   "dense (tp-cp-dp-pp) or expert (etp-ep-edp-pp)" },
    { "axes",    "array", "axis names in rank order, fastest first (Megatron's names)" },
    { "sizes",   "array", "size of each axis" },
    { "strides", "array", "rank stride of each axis (prefix products)" },
})

record("GroupKind", {
    { "name",    "str",   "tp, pp, dp, ..., embd, pos-embd" },
    { "grid",    "str",   "dense, expert, or pp (embd and pos-embd derive from pp groups)" },
    { "token",   "str",   "Megatron's get_ranks token (tp-pp for mp); '' for embd kinds" },
    { "mask",    "array", "per grid axis: true if it varies inside a group (embd kinds: {})" },
    { "size",    "int",   "ranks per group" },
    { "count",   "int",   "number of groups" },
    { "msizes",  "array", "sizes of the axes that vary inside a group, fastest first" },
    { "mstrides", "array", "their rank strides (member j = base + mixed radix of j)" },
    { "usizes",  "array", "sizes of the axes that number the groups, fastest first" },
    { "ustrides", "array", "their rank strides (base of group g = mixed radix of g)" },
})

record("Topology", {
    { "world",  "int",   "number of ranks" },
    { "order",  "str",   "rank order as given" },
    { "sizes",  "map",   "tp cp dp pp ep etp edp vp" },
    { "dense",  "Grid",  "attention grid" },
    { "expert", "Grid",  "expert (MoE) grid" },
    { "kinds",  "array", "GroupKind list, in topology.json order" },
    { "index",  "map",   "kind name -> position in kinds" },
})

-- -- Layer placement (partition.lua) --------------------------------------------------------

record("Chunk", {
    { "vp",        "int",  "virtual chunk index on the stage" },
    { "first",     "int",  "first global layer (0-based)" },
    { "count",     "int",  "layers in this chunk (first .. first+count-1); may be 0 " ..
                           "(a layout's embedding- or loss-only chunk)" },
    { "embedding", "bool", "holds wte/wpe (stage 0, chunk 0)" },
    { "head",      "bool", "holds ln_f, the LM head and the loss (last stage, last chunk)" },
})

record("Stage", {
    { "stage",  "int",   "pipeline stage (pp coordinate)" },
    { "count",  "int",   "layers on this stage, all chunks" },
    { "chunks", "array", "Chunk list, vp = 0 .. V-1" },
})

record("Partition", {
    { "layers", "int",   "model layers" },
    { "pp",     "int",   "stages" },
    { "vp",     "int",   "chunks per stage" },
    { "stages", "array", "Stage list, stage = 0 .. P-1" },
})

-- -- Parameter shards (shards.lua) ----------------------------------------------------------

record("Piece", {
    { "start", "array", "global start index per dimension" },
    { "size",  "array", "extent per dimension" },
    { "at",    "array", "start of this piece in the local tensor, per dimension" },
})

record("Param", {
    { "name",         "str",   "Hugging Face GPT-2 name (h.3.attn.c_attn.weight)" },
    { "role",         "str",   "name without layer/expert index (attn.c_attn.weight)" },
    { "layer",        "int?",  "global layer, nil for wte/wpe/ln_f" },
    { "expert_id",    "int?",  "global expert index for expert weights" },
    { "chunk",        "int",   "model chunk (vp) that holds it" },
    { "shape",        "array", "global shape, HF layout (Conv1D weights are [in, out])" },
    { "local_shape",  "array", "shape of the local tensor on this rank" },
    { "numel",        "int",   "elements of the local tensor (vocab padding included)" },
    { "split",        "str",   "none | column | row | vocab (how TP/ETP splits it)" },
    { "tp_sharded",   "bool",  "Megatron's tensor_model_parallel attribute" },
    { "tp_duplicate", "bool",  "replica on a (expert-)TP rank > 0: left out of the grad norm" },
    { "expert",       "bool",  "an expert weight (its TP group is expt-tp)" },
    { "tied",         "bool",  "the last stage's copy of wte used by the LM head (PP > 1)" },
    { "seq_parallel", "bool",  "tagged sequence_parallel (norms, row biases, router)" },
    { "shared_embedding", "bool", "wte or its tied copy with PP > 1: own dist-opt bucket" },
    { "buffer",       "str",   "dense | expert: which grad buffer (and dp group) it uses" },
    { "reduce",       "array", "groups its gradient is reduced over, in order" },
    { "pieces",       "array", "Piece list: the global ranges held; they tile the real part" },
})

record("Slot", {
    { "name",   "str", "param name" },
    { "offset", "int", "start in the buffer (elements, multiple of 64)" },
    { "numel",  "int", "elements" },
})

record("Bucket", {
    { "start", "int",   "first element in the buffer" },
    { "size",  "int",   "elements incl. end padding (multiple of lcm(dp_shards, 128))" },
    { "shard", "int",   "size / dp_shards: what each data-parallel rank owns" },
    { "slots", "array", "Slot list, in buffer order (reverse parameter order)" },
})

record("Buffer", {
    { "chunk",     "int",   "model chunk" },
    { "kind",      "str",   "dense (reduced over dp-cp) or expert (over expt-dp)" },
    { "dp_shards", "int",   "size of the group the optimizer state is sharded over" },
    { "numel",     "int",   "sum of its params' elements" },
    { "size",      "int",   "distributed-optimizer layout size, padding included" },
    { "shard",     "int",   "elements of optimizer state per rank (sum of bucket shards)" },
    { "buckets",   "array", "Bucket list" },
})

record("Bytes", {
    { "dtype",    "str",  "Dtype name" },
    { "dist_opt", "bool", "with the distributed optimizer" },
    { "params",   "int",  "bytes of model parameters" },
    { "grads",    "int",  "bytes of gradient buffers" },
    { "optim",    "int",  "bytes of optimizer state (main params/grads, Adam moments)" },
    { "total",    "int",  "params + grads + optim" },
})

record("Dtype", {
    { "name",  "str", "short name (fp16, bf16-fp32, fp32)" },
    { "label", "str", "what it means" },
    { "param", "int", "bytes per parameter" },
    { "grad",  "int", "bytes per gradient" },
    { "optim", "int", "bytes of optimizer state per parameter (docs/megatron.md §5.7)" },
})

record("Class", {
    { "id",      "int",   "class index (0-based)" },
    { "pp",      "int",   "pipeline stage" },
    { "tp",      "int",   "tensor-parallel rank" },
    { "ep",      "int",   "expert-parallel rank (0 for dense models)" },
    { "etp",     "int",   "expert-TP rank (0 for dense models)" },
    { "ranks",   "int",   "how many ranks are in this class" },
    { "first",   "int",   "lowest rank of the class" },
    { "params",  "array", "Param list in Megatron's named_parameters order, chunk by chunk" },
    { "numel",   "int",   "local elements held, all params" },
    { "buffers", "array", "Buffer list (chunk-major, dense before expert)" },
    { "bytes",   "array", "Bytes per Dtype, without then with the distributed optimizer" },
})

record("Shards", {
    { "classes",       "array", "Class list, numbered in order of their lowest rank" },
    { "keys",          "map",   "'pp,tp,ep,etp' coordinates -> class id (shards.class_of)" },
    { "key_axes",      "array", "stride, size of dense pp and tp, expert ep and tp" },
    { "has_moe",       "bool",  "expert coordinates are part of the key" },
    { "dtypes",        "array", "Dtype list (docs/megatron.md §5.7)" },
    { "unique",        "int",   "unique parameters of the model (no padding, no tied copy)" },
    { "unique_dense",  "int",   "of which not in experts" },
    { "unique_expert", "int",   "of which in experts" },
    { "held",          "int",   "elements held summed over all ranks (replicas, padding)" },
})

-- -- Output (emit.lua) ------------------------------------------------------------------------

record("File", {
    { "name", "str", "path inside the output directory" },
    { "what", "str", "one line for MANIFEST" },
    { "text", "str", "full contents" },
})

-- -- Pipeline schedule (schedule.lua) ------------------------------------------------------

record("Exchange", {
    { "send",  "bool", "true: send, false: receive" },
    { "dir",   "str",  "prev | next: the pipeline neighbour (wrapping)" },
    { "what",  "str",  "act (activations, forward) | grad (gradients, backward)" },
    { "mb",    "int",  "micro-batch of the tensor" },
    { "chunk", "int",  "local chunk: that produced it (send) or will consume it (receive)" },
})

record("Step", {
    { "kind",  "str",    "F (forward) | B (backward) | X (exchange) | C (collective, verify)" },
    { "phase", "str?",   "warmup | steady | cooldown" },
    { "k",     "int?",   "F, B: Megatron's virtual micro-batch id" },
    { "mb",    "int?",   "F, B: micro-batch" },
    { "chunk", "int?",   "F, B: local chunk" },
    { "ops",   "array?", "X: Exchange list, posted together in this order" },
    { "async", "bool?",  "X: completed only before the next exchange (activations sent " ..
                         "during the computation that follows)" },
    { "group", "str?",   "C: the collective's group (verify's key)" },
    { "members", "array?", "C: the stages in the group" },
    { "name",  "str?",   "C: what it is, for counterexamples" },
})

record("StageSchedule", {
    { "stage",    "int",   "pipeline stage" },
    { "steps",    "array", "Step list: the stage's straight-line program for one step" },
    { "warmup",   "int",   "forward passes before the first backward" },
    { "steady",   "int",   "one-forward-one-backward pairs" },
    { "cooldown", "int",   "backward passes after the last forward" },
})

record("Schedule", {
    { "kind",   "str",   "none | 1f1b | interleaved" },
    { "P",      "int",   "pipeline stages" },
    { "V",      "int",   "chunks per stage" },
    { "M",      "int",   "micro-batches per step" },
    { "N",      "int",   "micro-batch group of the interleaved schedule" },
    { "stages", "array", "StageSchedule list, stage r at [r+1]" },
})

-- -- The training program (program.lua; printed by emit.lua and templates/program/) -------------

record("Const", {
    { "name",    "str", "CFG_ name in model.h" },
    { "kind",    "str", "int | float | double | str | ident (a C name, printed as is)" },
    { "value",   "any", "its value: an integer, a number or a string" },
    { "comment", "str", "its origin" },
})

record("Role", {
    { "name",  "str", "name pattern: wte.weight, h.%d.ln_1.weight, h.%d.mlp.experts.%d...." },
    { "scope", "str", "BEFORE | LAYER | EXPERT | AFTER: where it repeats in checkpoint order" },
    { "rows",  "int", "global rows (1 for 1-D tensors)" },
    { "cols",  "int", "global columns" },
    { "ndim",  "int", "1 or 2, as saved" },
    { "init",  "str", "NORMAL | ZERO | ONE" },
    { "std",   "num", "standard deviation of NORMAL" },
})

record("GridAxes", {
    { "size",   "array", "size per axis tp, cp, ep, dp, pp" },
    { "stride", "array", "rank stride per axis tp, cp, ep, dp, pp" },
})

record("Group", {
    { "id",      "str",   "the program's name: TP DPCP PP EMBD MP EP ETP EDP TPEPPP" },
    { "kind",    "str",   "topology kind (tp, dp-cp, ..., embd)" },
    { "grid",    "str",   "DENSE | EXPERT | EMBD" },
    { "axes",    "array", "axes that vary inside a group (tp cp ep dp pp)" },
    { "size",    "int",   "members per group" },
    { "create",  "bool",  "the program creates it (used and more than one member)" },
    { "spans",   "bool",  "its groups span pipeline stages (pp varies, or embd)" },
    { "comment", "str",   "what the program uses it for" },
    { "msizes",  "array", "sizes of the axes that vary inside a group, the fastest first " ..
                          "(topology.lua's; embd: the pp axis)" },
    { "mstrides", "array", "their rank strides: the members of rank r's group are r's base " ..
                           "plus every mixed-radix combination of them" },
})

-- -- The code of the model pieces (layer.lua) --------------------------------------------------

record("Term", {
    { "c", "int",   "integer coefficient" },
    { "f", "array", "factors: size names (N_SP: CFG_N_SP) or C expressions of run-time values" },
})

record("Expr", {
    { "terms", "array", "Term list, summed" },
    { "value", "int?",  "its value for this layout; nil when a factor is known only at run time" },
})

record("Arg", {
    { "kind", "str",   "mem (a memory-plan buffer) | param | grad (a tensor or its f32 " ..
                       "gradient, by field) | int (an Expr) | float (a named constant) | " ..
                       "dtype (ACT, F32, I32) | lit (C text) | ident (a name the function has)" },
    { "id",   "str?",  "mem: the plan entry; param, grad: the field; float, lit, ident, dtype" },
    { "off",  "Expr?", "mem: elements past the buffer's start" },
    { "expr", "Expr?", "int: the value" },
})

record("Msg", {
    { "send",  "bool", "send or receive" },
    { "buf",   "Arg",  "the buffer" },
    { "n",     "Expr", "elements" },
    { "dtype", "str",  "f32 | bf16" },
    { "peer",  "str",  "CP_NEXT | CP_PREV | PP_NEXT | PP_PREV" },
    { "tag",   "str",  "RING_KV | RING_DKV | ACT | GRAD" },
})

record("Coll", {
    { "op",    "str",  "allreduce | allgather | reduce_scatter | alltoall | alltoallv | ring " ..
                       "(one hop of the cp ring: send to the next cp rank, receive from the " ..
                       "previous)" },
    { "group", "str",  "topology kind name (tp, dp-cp, ..., world)" },
    { "n",     "int?", "elements (per member for allgather/reduce_scatter/alltoall); nil: " ..
                       "data-dependent" },
    { "dtype", "str",  "f32 | bf16 | i32" },
    { "red",   "str?", "allreduce: sum | max" },
    { "n2",    "int?", "ring: f32 elements of dK|dV sent beside the n of K|V (backward)" },
    { "n_expr", "Expr?", "n as the generated code writes it" },
    { "send",  "Arg?", "the buffer sent (allreduce: reduced in place)" },
    { "recv",  "Arg?", "the buffer received" },
    { "a2a",   "str?", "alltoallv: which exchange of the MoE layer's plan gives the counts " ..
                       "(EP_ROWS, ...)" },
    { "rows",  "num?", "alltoallv: rows per peer with a balanced load (make inspect)" },
    { "width", "int?", "alltoallv: elements per row" },
    { "what",  "str?", "alltoallv: what it moves, for make inspect (nil: the probabilities " ..
                       "that go with the rows of the exchange before it)" },
})

record("Stmt", {
    { "kind",  "str",    "K (a call) | C (a collective) | S (a collective started into " ..
                         "req[n]) | WAIT (rt_wait of req[n]) | P (p2p: blocking, or started) | " ..
                         "W (the wait of the started p2p) | LOOP | NOTE (a comment)" },
    { "req",   "int?",   "S, WAIT: the request slot (WAIT: the first of nreq)" },
    { "nreq",  "int?",   "WAIT: request slots waited, req .. req + nreq - 1" },
    { "fn",    "str?",   "K: the function (layer.lua SIGNATURES); S: the stage's helper that " ..
                         "starts it (grad_reduce_start, param_gather_start)" },
    { "args",  "array?", "K, S: Arg list" },
    { "coll",  "Coll?",  "C, P: what the verifier and the report see" },
    { "msgs",  "array?", "P: Msg list, posted together" },
    { "start", "bool?",  "P: started (completed by the next W) rather than blocking" },
    { "count", "Expr?",  "LOOP: iterations" },
    { "var",   "str?",   "LOOP: the counter" },
    { "body",  "array?", "LOOP: Stmt list" },
    { "text",  "str?",   "C, P: the comment naming the group and the section; NOTE, LOOP" },
})

record("AsyncOp", {
    { "req",    "int",   "its request slot in the stage's req[] (0-based)" },
    { "kind",   "str",   "reduce (a bucket's gradients over its data-parallel group) | gather " ..
                         "(a bucket's updated parameters, distributed optimizer)" },
    { "buf",    "int",   "buffer index" },
    { "bucket", "int",   "bucket index" },
    { "group",  "str",   "topology kind it runs over" },
    { "what",   "str",   "buffer and bucket, in words" },
    { "lo",     "int",   "first element of the bucket in the buffer" },
    { "hi",     "int",   "one past its last" },
    { "stmts",  "array", "Stmt list that starts it (one S statement)" },
    { "at",     "str",   "reduce: after which call (F3: the 3rd of the chunk's forward; B2) " ..
                         "the last micro-batch has written its gradients; gather: before which " ..
                         "call micro-batch 0 first reads its parameters" },
    { "chunk",  "int",   "the chunk (index in the stage) whose calls place it" },
})

record("ChunkItem", {
    { "kind", "str",  "call | start (an AsyncOp's statements) | wait (its rt_wait)" },
    { "call", "Call?", "call: the library call" },
    { "when", "str?", "start: last (only on the step's last micro-batch); wait: first " ..
                      "(only on micro-batch 0)" },
    { "op",   "AsyncOp?", "start, wait" },
})

record("Overlap", {
    { "items",    "array", "per chunk: { F = ChunkItem list, B = ChunkItem list }" },
    { "reduce",   "array", "AsyncOp list of the data-parallel reductions, in start order" },
    { "gather",   "array", "AsyncOp list of the parameter all-gathers, in start order" },
    { "nreq",     "int",   "request slots" },
    { "scale_only", "array", "buckets scaled by 1/(DP*CP) with no group to reduce over" },
    { "progress", "bool",  "rt_progress between the layers (communication in flight)" },
})

record("Code", {
    { "name",  "str",   "the function: embedding_fwd, layer_fwd, ..." },
    { "stmts", "array", "Stmt list" },
    { "comm",  "array", "Coll list: every collective and ring hop as it runs, loops unrolled" },
})

record("LayerProgram", {
    { "embedding_fwd", "Code", "tokens -> the chunk's input" },
    { "embedding_bwd", "Code", "its gradient -> wte, wpe" },
    { "layer_fwd",     "Code", "one transformer layer" },
    { "layer_bwd",     "Code", "its backward" },
    { "head",          "Code", "ln_f, logits, loss and their backward" },
})

record("Call", {
    { "op",    "str",   "embedding_fwd | embedding_bwd | layer_fwd | layer_recompute | " ..
                        "layer_bwd | head_fwd_bwd" },
    { "layer", "int?",  "layer_*: local index in the chunk" },
    { "global", "int?", "layer_*: global layer" },
    { "comm",  "array", "Coll list: the collectives the library runs inside, in order" },
})

record("P2P", {
    { "send",  "bool", "send or receive" },
    { "what",  "str",  "act | grad" },
    { "mb",    "int",  "micro-batch" },
    { "chunk", "int",  "local chunk of the buffer" },
    { "slot",  "int",  "act: the activation slot of the buffer; grad: the gradient buffer" },
    { "dir",   "str",  "prev | next" },
    { "peer",  "int",  "the peer's stage" },
    { "tag",   "str",  "ACT | GRAD" },
    { "n",     "int",  "elements (N_SP*C)" },
    { "dtype", "str",  "f32 | bf16: the activations' dtype" },
})

record("Op", {
    { "kind",   "str",    "F | B | X | SECTION | tail ops: BEGIN SCHEDULE DP_WAIT DP_REDUCE " ..
                          "GRAD_SCALE SP_ALLREDUCE EMBD_ALLREDUCE NORM_LOCAL NORM_ALLREDUCE " ..
                          "NORM ADAMW PARAM_ALLGATHER EXPERT_BIAS AUX_ALLREDUCE " ..
                          "LOSS_ALLREDUCE" },
    { "text",   "str",    "one line for the generated comment" },
    { "mb",     "int?",   "F, B: micro-batch" },
    { "chunk",  "int?",   "F, B: local chunk" },
    { "slot",   "int?",   "F, B: activation slot" },
    { "dy",     "int?",   "F, B: the gradient buffer its slot's dy is (-1: none yet)" },
    { "calls",  "array?", "F, B: Call list" },
    { "p2p",    "array?", "X: P2P list, posted together" },
    { "async",  "bool?",  "X: only activations sent, completed during the computation after " ..
                          "it (overlap)" },
    { "group",  "str?",   "tail: the Group id it communicates on" },
    { "buf",    "int?",   "tail: buffer index" },
    { "bucket", "int?",   "tail: bucket index" },
    { "offset", "int?",   "EMBD_ALLREDUCE: first element" },
    { "n",      "int?",   "EMBD_ALLREDUCE, SP_ALLREDUCE: elements" },
    { "which",  "int?",   "NORM_ALLREDUCE: 0 dense, 1 experts, 2 total; NORM: 1 = total" },
    { "scale",  "num?",   "GRAD_SCALE: the factor" },
    { "comm",   "array",  "Coll list of this op (F/B: of every call; X: none)" },
    { "stmts",  "array?", "tail: the statements it runs (layer.lua Stmt)" },
})

record("ProgBucket", {
    { "start", "int", "first element in the buffer" },
    { "size",  "int", "elements incl. padding" },
    { "shard", "int", "what each data-parallel rank owns" },
    { "base",  "int", "the shard's offset in this rank's optimizer state" },
})

record("ProgBuffer", {
    { "chunk",   "int",   "model chunk" },
    { "expert",  "bool",  "expert buffer (expt-dp, its own norm sum)" },
    { "size",    "int",   "elements, padding included" },
    { "state",   "int",   "elements of each AdamW moment (the shard with DIST_OPT)" },
    { "sharded", "bool",  "distributed optimizer" },
    { "group",   "str",   "Group id of its data-parallel group" },
    { "buckets", "array", "ProgBucket list" },
})

record("ProgParam", {
    { "name",   "str",  "the tensor at layer 0 / tp rank 0 (for comments)" },
    { "field",  "str",  "gpt_field suffix: WTE, LN1_W, QKV_W, EXPERT_FC_W, ..." },
    { "expert", "int",  "local expert index, -1" },
    { "buf",    "int",  "buffer index" },
    { "decay",  "bool", "AdamW weight decay" },
    { "sp_reduce", "bool", "gradient all-reduced over tp (sequence parallelism)" },
    { "norm",   "str",  "ALWAYS | TP0 | ETP0 | NEVER: how the gradient norm counts it" },
    { "role",   "int",  "index into the program's roles" },
    { "ld",     "int",  "local row stride" },
    { "offset", "int",  "in the buffer (layer tables: from the layer's base)" },
    { "n",      "int",  "elements" },
})

record("ProgPiece", {
    { "param",      "int",  "row of the same table (0-based)" },
    { "lrow",       "int",  "first local row" },
    { "lcol",       "int",  "first local column" },
    { "grow",       "int",  "first global row at coordinate 0" },
    { "gcol",       "int",  "first global column at coordinate 0" },
    { "rows",       "int",  "rows" },
    { "cols",       "int",  "columns" },
    { "split",      "str",  "NONE | TP | ETP: the coordinate that moves it" },
    { "step_row",   "int",  "global rows per coordinate" },
    { "step_col",   "int",  "global columns per coordinate" },
    { "replicated", "bool", "same values on every (expert-)tp rank" },
    { "tied",       "bool", "the head's copy of wte" },
    { "expert",     "bool", "saved by expert-data-parallel rank 0" },
    { "vocab",      "bool", "rows past the vocabulary are padding" },
})

record("ProgChunk", {
    { "vp",        "int",   "chunk index" },
    { "first",     "int",   "first global layer" },
    { "layers",    "int",   "layers" },
    { "slots",     "int",   "activation slots (micro-batches in flight at most)" },
    { "embedding", "bool",  "holds the embedding" },
    { "head",      "bool",  "holds the head and the loss" },
    { "bases",     "array", "per layer: its base offset in each buffer (array of arrays)" },
    { "shifts",    "array?", "per layer, per tensor row: what its offset adds to the row's " ..
                             "(a gradient bucket's padding inside the layer); nil: nothing" },
    { "store",     "array", "per layer: LayerStore, where its activations are kept" },
    { "slot_bytes", "int",  "device bytes of one activation slot" },
})

record("LayerStore", {
    { "work",     "int",  "-1: every activation in its slot; else the recompute workspace " ..
                          "position of the buffers recompute drops (docs/megatron.md §9.2)" },
    { "keep_out", "bool", "its output (res2) stays in the slot (a full-recompute group's last)" },
})

record("Mem", {
    { "id",       "str",  "gpt_mem_id suffix (L_LN1, S_FULL, ...)" },
    { "how",      "str",  "ALLOC | ALIAS | NONE" },
    { "alias",    "str?", "ALIAS: the id it shares" },
    { "dtype",    "str",  "A (the activations' dtype) | F (f32) | I (i32)" },
    { "elems",    "int",  "elements of one instance" },
    { "instance", "int",  "bytes of one instance" },
    { "count",    "int",  "instances in activation slots (or the one of the stage)" },
    { "work",     "int",  "instances in the recompute workspace (positions used)" },
    { "bytes",    "int",  "instance * (count + work)" },
    { "work_bytes", "int", "instance * work" },
    { "category", "str",  "activations | workspace | communication" },
    { "what",     "str",  "shape and meaning" },
})

record("MemParams", {
    { "params",  "int", "model parameters (f32, or bf16 with BF16=1)" },
    { "main",    "int", "f32 main parameters of bf16 training (the shard with DIST_OPT)" },
    { "grads",   "int", "f32 main gradients" },
    { "moments", "int", "AdamW's two f32 moments (the shard with DIST_OPT)" },
})

record("StageProgram", {
    { "stage",         "int",   "pipeline stage" },
    { "title",         "str",   "stage k of P: what its chunks hold" },
    { "ranks",         "str",   "the ranks that run it, compactly" },
    { "buffers",       "array", "ProgBuffer list" },
    { "chunks",        "array", "ProgChunk list" },
    { "layer_params",  "array", "ProgParam list of one layer (every layer alike)" },
    { "other_params",  "array", "ProgParam list: embedding and head tensors" },
    { "layer_pieces",  "array", "ProgPiece list of one layer's tensors" },
    { "other_pieces",  "array", "ProgPiece list of the other tensors" },
    { "nparams",       "int",   "local tensors in all (layers expanded)" },
    { "mem",           "array", "Mem list, every gpt_mem_id in order" },
    { "params",        "MemParams", "the parameter buffers' bytes" },
    { "param_bytes",   "int",   "parameters, main parameters, gradients and moments" },
    { "mem_bytes",     "int",   "every device byte setup allocates" },
    { "needs_inputs",  "bool",  "reads token ids" },
    { "needs_targets", "bool",  "reads targets" },
    { "head_uses_wte", "bool",  "embedding and head here: the head uses wte itself" },
    { "warmup",        "int",   "schedule: warm-up forwards" },
    { "steady",        "int",   "schedule: steady pairs" },
    { "cooldown",      "int",   "schedule: cool-down backwards" },
    { "inflight",      "int",   "micro-batches in flight at most" },
    { "pool_slots",    "int",   "0: each chunk's activation slots its own; else the slots " ..
                                "the chunks share (slot k of every chunk is the same memory)" },
    { "pool_slot_bytes", "int", "device bytes of one slot of that pool (0 without one)" },
    { "grad_buffers",  "int",   "buffers for the gradients of the chunks' outputs, held from " ..
                                "their arrival to the send of the input's (schedule.assign_dy)" },
    { "schedule",      "array", "Op list: the unrolled schedule (F, B, X, SECTION)" },
    { "overlap",       "Overlap", "where the asynchronous communication starts and is waited" },
    { "tail",          "array", "Op list: the step around and after the schedule" },
    { "eval_schedule", "array", "Op list: the forward-only schedule of an evaluation (F, X): " ..
                                "the schedule less its backwards and gradient messages" },
    { "eval_tail",     "array", "Op list: the evaluation's loss after its schedule" },
})

record("Program", {
    { "model",    "str",   "model file" },
    { "layout",   "str",   "tp2 pp2 dp2 (for messages)" },
    { "model_text", "str", "the resolved model as key=value lines (resume checkpoints)" },
    { "layout_text", "str", "the layout as key=value lines (resume checkpoints)" },
    { "made_by",  "str",   "the command that regenerates the program (cfg.make)" },
    { "schedule_kind", "str", "none | 1f1b | interleaved" },
    { "consts",   "array", "Const list (model.h)" },
    { "roles",    "array", "Role list: the model's tensors in checkpoint order" },
    { "dense",    "GridAxes", "attention grid" },
    { "expert",   "GridAxes", "expert grid" },
    { "groups",   "array", "Group list, in creation order" },
    { "stages",   "array", "StageProgram list, stage k at [k+1]" },
    { "layer",    "LayerProgram", "the code of the embedding, the layer and the head" },
})

-- The field list of each record, for documentation (--dump schema).
function M.schema()
    local names, out = {}, {}
    for name in pairs(registry) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do
        local mt = registry[name].mt
        local fields = {}
        for i, f in ipairs(mt.__doc) do fields[i] = { name = f[1], type = f[2], doc = f[3] } end
        out[#out + 1] = { record = name, fields = fields }
    end
    return out
end

return M
