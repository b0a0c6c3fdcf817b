-- ir.lua: the records handed between passes, each declared once with its fields (a small
-- version of Terra's ASDL). Read this first: it is the contract between config, topology,
-- partition, shards, inspect and emit (and the later schedule/program passes).
--
-- M.Name{...} checks every declared field's type, rejects undeclared ones, and returns the
-- table as a record; reading an undeclared field of a record is an error (typos fail loudly).
-- Types: int, num, str, bool, array (a Lua sequence), map (string-keyed table), a record name;
-- a trailing "?" makes the field optional. All indices and ranks stored here are 0-based, as
-- in Megatron and in the JSON files; Lua arrays themselves are 1-based.

local M = {}

local registry = {}     -- record name -> { mt = metatable, fields = {...} }

local function type_ok(v, ty)
    if ty == "int" then return math.type(v) == "integer"
    elseif ty == "num" then return type(v) == "number"
    elseif ty == "str" then return type(v) == "string"
    elseif ty == "bool" then return type(v) == "boolean"
    elseif ty == "array" or ty == "map" then return type(v) == "table"
    end
    local rec = registry[ty]
    return rec ~= nil and getmetatable(v) == rec.mt
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
    M[name] = function(t)
        for k in pairs(t) do
            if not types[k] then
                error(string.format("ir: %s has no field '%s'", name, tostring(k)), 2)
            end
        end
        for _, field in ipairs(fields) do
            local v = t[field]
            if v == nil then
                if not optional[field] then
                    error(string.format("ir: %s.%s is required", name, field), 2)
                end
            elseif not type_ok(v, types[field]) then
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
    { "pre_softmax",     "bool", "softmax over all experts before top-k (default false)" },
    { "capacity_factor", "num?", "token capacity factor; nil = no dropping" },
    { "bias",            "bool", "expert fc/proj have biases (default true; needs ETP 1)" },
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
})

-- -- Validated configuration (config.lua) --------------------------------------------------

record("Config", {
    { "model",        "Model", "the model description" },
    { "tp",           "int",   "tensor parallel (T)" },
    { "pp",           "int",   "pipeline stages (P)" },
    { "dp",           "int",   "data parallel, without CP (D)" },
    { "cp",           "int",   "context parallel (C)" },
    { "ep",           "int",   "expert parallel (E)" },
    { "etp",          "int",   "expert tensor parallel (Te, default T)" },
    { "edp",          "int",   "expert data parallel, derived: world / (Te*E*P)" },
    { "vp",           "int",   "virtual pipeline chunks per stage (V)" },
    { "world",        "int",   "T*C*D*P = Te*E*EDP*P" },
    { "order",        "str",   "rank order as given, lower case (tp-cp-ep-dp-pp)" },
    { "axes",         "array", "order with size-1 axes Megatron appends: 5 names" },
    { "first_layers", "int?",  "layers on the first stage (uneven split); nil = even" },
    { "last_layers",  "int?",  "layers on the last stage (uneven split); nil = even" },
    { "mbs",          "int",   "micro-batch size" },
    { "nmb",          "int",   "micro-batches per step (M)" },
    { "seq",          "int",   "training sequence length (<= model.seq_len)" },
    { "sp",           "bool",  "sequence parallelism" },
    { "dist_opt",     "bool",  "distributed optimizer" },
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
    { "members", "array", "flat: group g (0-based) is members[g*size+1 .. (g+1)*size]" },
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
    { "count",     "int",  "layers in this chunk (first .. first+count-1)" },
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
    { "optim", "int", "bytes of optimizer state per parameter (seed 002)" },
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
    { "rank_class",    "array", "rank_class[r+1] = class id of rank r" },
    { "dtypes",        "array", "Dtype list (seed 002's table)" },
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
