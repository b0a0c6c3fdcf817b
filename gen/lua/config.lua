-- config.lua: load a model description (sandboxed) and validate it with the parallel sizes.
-- config.load(opts) -> Config (ir.lua). Every rule Megatron-LM enforces on these sizes is
-- checked here (docs/megatron.md §1.3, §2), plus the ones it forgets; problems are collected
-- and raised together (diag.collect). Errors about a model value point at the line of its
-- key in the model file; errors about sizes alone read "gen: error: ...".
-- Reads the model file; otherwise pure. Called by driver.lua and the tests.

local diag = require("diag")
local host = require("host")
local ir = require("ir")
local json = require("json")
local partition = require("partition")
local sandbox = require("sandbox")
local util = require("util")

local M = {}

M.DEFAULT_ORDER = "tp-cp-ep-dp-pp"
M.AXES = { tp = true, cp = true, ep = true, dp = true, pp = true }
-- Megatron appends axes missing from the order in this order (RankGenerator.name_to_size).
M.APPEND_ORDER = { "tp", "pp", "dp", "ep", "cp" }
M.MAX_SIZE = 1 << 20            -- largest world (and parallel size) the generator accepts
M.MAX_CP = 4096                 -- largest CP (lib/gpt.h GPT_MAX_CP)
M.MAX_NMB = 4096                -- largest NMB: the stage files list every micro-batch's rows,
                                -- and 4096 generate in about 2 s (65536: 30 s, 1.2 GB)
M.MAX_PARAMS = 1 << 42          -- largest model it counts exactly (bytes summed over ranks)

-- -- Reading model descriptions ------------------------------------------------------------

-- 'src' with the insides of comments and strings blanked out (newlines kept, so line
-- numbers hold): what the scanners below search, so that "gpt {" in a comment or a
-- description string is not taken for code.
local function code_only(src)
    local out, i, len = {}, 1, #src
    local function blank(a, b)
        out[#out + 1] = src:sub(a, b):gsub("[^\n]", " ")
    end
    while i <= len do
        local c = src:sub(i, i)
        if c == "-" and src:sub(i + 1, i + 1) == "-" then
            local eq = src:match("^%[(=*)%[", i + 2)
            local stop
            if eq then
                stop = select(2, src:find("]" .. eq .. "]", i, true)) or len
            else
                stop = (src:find("\n", i, true) or len + 1) - 1
            end
            blank(i, stop)
            i = stop + 1
        elseif c == '"' or c == "'" then
            local j = i + 1
            while j <= len do
                local d = src:sub(j, j)
                if d == "\\" then j = j + 2
                elseif d == c or d == "\n" then break
                else j = j + 1 end
            end
            out[#out + 1] = c
            blank(i + 1, j - 1)
            out[#out + 1] = src:sub(j, j)
            i = j + 1
        elseif c == "[" and src:match("^%[=*%[", i) then
            local eq = src:match("^%[(=*)%[", i)
            local stop = select(2, src:find("]" .. eq .. "]", i, true)) or len
            out[#out + 1] = '""'
            blank(i + 2, stop)
            i = stop + 1
        else
            local j = src:find("[-\"'%[]", i + 1) or len + 1
            out[#out + 1] = src:sub(i, j - 1)
            i = j
        end
    end
    return table.concat(out)
end

-- Line of the start of byte 'pos' in 'src'.
local function line_at(src, pos)
    local n = 1
    for _ in src:sub(1, pos - 1):gmatch("\n") do n = n + 1 end
    return n
end

-- Where each key of a constructor's table is written: 'code' is code_only(src); the call of
-- 'fname' is the first one on or after line 'line'. Records identifiers followed by '=' at
-- brace depth 1 -> map key -> line. Keys it cannot see (a table built elsewhere) fall back
-- to the call's line.
local function key_lines(code, fname, line)
    local lines, pos, n = {}, 1, 1
    while n < line do
        local nl = code:find("\n", pos, true)
        if not nl then return lines end
        pos, n = nl + 1, n + 1
    end
    local call = code:find("%f[%w_]" .. fname .. "%s*[{(]", pos)
    local brace = call and code:find("{", call, true)
    if not brace then return lines end
    n = line_at(code, brace)
    local i, depth, len = brace + 1, 1, #code
    while i <= len and depth > 0 do
        local c = code:sub(i, i)
        if c == "\n" then
            n = n + 1
        elseif c == "{" or c == "(" or c == "[" then
            depth = depth + 1
        elseif c == "}" or c == ")" or c == "]" then
            depth = depth - 1
        elseif c:match("[%a_]") then
            local word = code:match("^[%w_]+", i)
            if depth == 1 and lines[word] == nil and code:match("^[ \t]*=[^=]", i + #word) then
                lines[word] = n
            end
            i = i + #word - 1
        end
        i = i + 1
    end
    return lines
end

-- Keys given twice in one table constructor of 'code' (code_only(src); 'src' gives back the
-- text of ["string"] keys). A key is a name, or a ["string"] without escapes, at the start of
-- a field: right after '{', ',' or ';' of that constructor itself, not inside brackets or a
-- function body within it. Returns a list of {line =, key =, first =} (the earlier line).
-- Lua keeps only the last value of a repeated key, so this can only be seen in the source.
local BLOCK_OPEN = { ["function"] = true, ["if"] = true, ["do"] = true, ["repeat"] = true }
local BLOCK_CLOSE = { ["end"] = true, ["until"] = true }
local FIELD_START = { ["{"] = true, [","] = true, [";"] = true }
local function duplicate_keys(code, src)
    local dups, newlines = {}, {}
    for pos in code:gmatch("()\n") do newlines[#newlines + 1] = pos end
    local function line_of(pos)             -- 1 + newlines before 'pos' (binary search)
        local lo, hi = 1, #newlines + 1
        while lo < hi do
            local mid = (lo + hi) // 2
            if newlines[mid] < pos then lo = mid + 1 else hi = mid end
        end
        return lo
    end
    -- a stack of open constructs: "table" (with its keys), "bracket" ( or [, "block"
    local stack = { { kind = "block" } }
    local function key(name, pos)
        local t = stack[#stack]
        local first = t.keys[name]
        if first then
            dups[#dups + 1] = { line = line_of(pos), key = name, first = first }
        else
            t.keys[name] = line_of(pos)
        end
    end
    local i = 1
    while true do
        i = code:find("%S", i)
        if not i then break end
        local top = stack[#stack]
        local at_field = top.kind == "table" and FIELD_START[top.prev]
        local c = code:sub(i, i)
        local word = code:match("^[%a_][%w_]*", i)
        top.prev = c
        if word then
            if BLOCK_OPEN[word] then
                stack[#stack + 1] = { kind = "block" }
            elseif BLOCK_CLOSE[word] and #stack > 1 then
                stack[#stack] = nil
                stack[#stack].prev = word
            elseif at_field and code:match("^%s*=[^=]", i + #word) then
                key(word, i)
            end
            i = i + #word
        elseif c:match("%d") then
            i = i + #code:match("^[%w_.]*", i)
        else
            if c == "{" then
                stack[#stack + 1] = { kind = "table", prev = "{", keys = {} }
            elseif c == "(" or c == "[" then
                local q = at_field and c == "[" and code:match("^%[%s*()[\"']", i)
                local close = q and code:find(code:sub(q, q), q + 1, true)
                local text = close and src:sub(q + 1, close - 1)
                if close and src:sub(q, q) == code:sub(q, q) and not text:find("[\\\n]")
                   and code:match("^%s*%]%s*=[^=]", close + 1) then
                    key(text, i)
                end
                stack[#stack + 1] = { kind = "bracket" }
            elseif (c == "}" or c == ")" or c == "]") and #stack > 1 then
                stack[#stack] = nil
                stack[#stack].prev = c
            end
            i = i + 1
        end
    end
    return dups
end

-- Line of the n-th call of constructor 'fname' in 'code' (code_only), 1 if not found.
local function call_line(code, fname, nth)
    local pos, n, line = 1, 0, 1
    while true do
        local at = code:find("%f[%w_]" .. fname .. "%s*[{(\"'%[]", pos)
        if not at then return line end
        n, line = n + 1, line_at(code, at)
        if n == nth then return line end
        pos = at + 1
    end
end

-- Describe a model-supplied value for an error message.
local function show(v)
    if type(v) == "string" then
        if #v > 40 then v = v:sub(1, 37) .. "..." end
        return "string " .. json.str(v)
    elseif type(v) == "number" and (v ~= v or v == math.huge or v == -math.huge) then
        return v ~= v and "nan" or v > 0 and "inf" or "-inf"
    elseif math.type(v) == "float" and v == math.floor(v) and math.abs(v) < 1e15 then
        return string.format("%.1f", v)
    elseif type(v) == "number" then
        return json.num(v)
    end
    return type(v)
end

-- A model-supplied key for an error message: at most 40 characters, no control characters.
local function key_name(k)
    if #k > 40 then k = k:sub(1, 37) .. "..." end
    return (k:gsub("%c", "?"))
end

-- Problem with 'v' as a size (an integer >= 1), or nil.
local function int_problem(key, v, max)
    if math.type(v) == "float" and v == math.floor(v) and v == v and math.abs(v) < 2^63 then
        return string.format("%s must be an integer (got %s, a float: use // for integer division)",
                             key, show(v))
    elseif math.type(v) ~= "integer" then
        return string.format("%s must be an integer (got %s)", key, show(v))
    elseif v < 1 then
        return string.format("%s must be at least 1 (got %d)", key, v)
    elseif v > max then
        return string.format("%s (%d) is too large (at most %d)", key, v, max)
    end
end

-- The model schema. kind: int (>= 1, <= max), pos (number > 0), nonneg (number >= 0),
-- str, bool, moe. ORDER GPT_KEYS / MOE_KEYS: the order of checks and of known-key lists.
local GPT_KEYS = {
    { "layers",      "int", true,  1 << 14 },
    { "hidden",      "int", true,  1 << 20 },
    { "heads",       "int", true,  1 << 20 },
    { "seq_len",     "int", true,  1 << 24 },
    { "vocab",       "int", true,  1 << 26 },
    { "ffn_hidden",  "int", false, 1 << 24 },
    { "norm_eps",    "pos", false },
    { "init_std",    "pos", false },
    { "vocab_pad",   "int", false, 1 << 20 },
    { "description", "str", false },
    { "add_bias_linear", "bool", false },
    { "moe",         "moe", false },
}
-- llama{}: the Llama family (Hugging Face LlamaForCausalLM; with moe, MixtralForCausalLM).
local LLAMA_KEYS = {
    { "layers",         "int",  true,  1 << 14 },
    { "hidden",         "int",  true,  1 << 20 },
    { "heads",          "int",  true,  1 << 20 },
    { "kv_heads",       "int",  false, 1 << 20 },
    { "ffn_hidden",     "int",  true,  1 << 24 },
    { "seq_len",        "int",  true,  1 << 24 },
    { "vocab",          "int",  true,  1 << 26 },
    { "norm_eps",       "pos",  false },
    { "rope_theta",     "pos",  false },
    { "tie_embeddings", "bool", false },
    { "init_std",       "pos",  false },
    { "vocab_pad",      "int",  false, 1 << 20 },
    { "description",    "str",  false },
    { "moe",            "moe",  false },
}
local MOE_KEYS = {
    { "experts",         "int",    true,  1 << 14 },
    { "top_k",           "int",    true,  1 << 14 },
    { "ffn_hidden",      "int",    false, 1 << 24 },
    { "aux_loss_coeff",  "nonneg", false },
    { "z_loss_coeff",    "nonneg", false },
    { "load_balancing",  "str",    false },
    { "topk_scaling_factor", "pos", false },
    { "score_function",  "str",    false },
    { "num_groups",      "int",    false, 64 },
    { "group_topk",      "int",    false, 64 },
    { "pre_softmax",     "bool",   false },
    { "capacity_factor", "pos",    false },
    { "drop_policy",     "str",    false },
    { "pad_to_capacity", "bool",   false },
    { "expert_bias",     "bool",   false },
    { "bias_update_rate", "pos",   false },
    { "shared_expert_ffn", "int",  false, 1 << 24 },
    { "bias",            "bool",   false, nil, "refused" },  -- only to explain add_bias_linear
}
local WHAT = {
    layers = "number of transformer layers", hidden = "model width",
    heads = "number of attention heads", seq_len = "maximum sequence length",
    vocab = "vocabulary size", experts = "number of experts", top_k = "experts per token",
    ffn_hidden = "the SwiGLU width",
}

-- The range of a C float (normal numbers), in which the programs hold 'pos'/'nonneg' fields.
local FLOAT_MIN, FLOAT_MAX = 1.1754943508222875e-38, 3.4028234663852886e38

local function known_list(keys)
    local names = {}
    for _, k in ipairs(keys) do
        if k[5] ~= "refused" then names[#names + 1] = k[1] end
    end
    return table.concat(names, ", ")
end

local MAX_FIELDS = 100       -- more fields in one constructor call are not looked at one by one

-- Check the fields of one constructor call against 'keys'; problems go to 'probs' as
-- {line, msg}. Returns a table of the values that passed.
local function check_fields(call, keys, ctor, probs, code, marks)
    local fields, out = call.fields, {}
    call.lines = key_lines(code, ctor, call.line)
    local function at(k) return call.lines[k] or call.line end
    local known = {}
    for _, spec in ipairs(keys) do known[spec[1]] = spec end
    local extra, n = {}, 0
    for _ in pairs(fields) do n = n + 1 end
    if n > MAX_FIELDS then
        probs[#probs + 1] = { call.line, string.format("%s{} has %d fields (it knows %d)", ctor,
                                                       n, #keys) }
        return out
    end
    for k in pairs(fields) do
        if type(k) ~= "string" then
            probs[#probs + 1] = { call.line, string.format(
                "%s{} takes named fields only (found a value at [%s])", ctor, show(k)) }
        elseif not known[k] then
            extra[#extra + 1] = k
        end
    end
    table.sort(extra)
    for _, k in ipairs(extra) do
        probs[#probs + 1] = { at(k), string.format("unknown key '%s' in %s{} (known keys: %s)",
                                                   key_name(k), ctor, known_list(keys)) }
    end
    for _, spec in ipairs(keys) do
        local k, kind, required, max = spec[1], spec[2], spec[3], spec[4]
        local v, problem = fields[k], nil
        if v == nil then
            if required then
                problem = string.format("%s{} needs '%s' (%s)", ctor, k, WHAT[k] or k)
            end
        elseif kind == "int" then
            problem = int_problem(k, v, max)
        elseif kind == "pos" or kind == "nonneg" then
            if type(v) ~= "number" then
                problem = string.format("%s must be a number (got %s)", k, show(v))
            elseif v ~= v or v == math.huge or v == -math.huge then
                problem = string.format("%s must be a finite number (got %s)", k, show(v))
            elseif kind == "pos" and v <= 0 then
                problem = string.format("%s must be greater than 0 (got %s)", k, show(v))
            elseif kind == "nonneg" and v < 0 then
                problem = string.format("%s must not be negative (got %s)", k, show(v))
            elseif v > FLOAT_MAX or (v ~= 0 and v < FLOAT_MIN) then
                problem = string.format("%s (%s) is out of range: the programs hold it in a " ..
                                        "float (%.2g to %.2g, or 0)", k, show(v), FLOAT_MIN,
                                        FLOAT_MAX)
            end
            if v == 0 then v = math.abs(v) end      -- -0.0 -> 0.0
        elseif kind == "str" and type(v) ~= "string" then
            problem = string.format("%s must be a string (got %s)", k, show(v))
        elseif kind == "bool" and type(v) ~= "boolean" then
            problem = string.format("%s must be true or false (got %s)", k, show(v))
        elseif kind == "moe" and not (type(v) == "table" and marks[v] == "moe") then
            problem = "moe must be made with moe{ experts = ..., top_k = ... }"
        end
        if problem then
            probs[#probs + 1] = { (v == nil) and call.line or at(k), problem }
        elseif v ~= nil then
            out[k] = v
        end
    end
    return out
end

-- The moe{} call whose result is the value of key moe in gpt call 'call', if any.
local function moe_call(calls, call)
    local v = type(call.fields) == "table" and call.fields.moe
    return v and calls[v] or nil
end

-- Resolve a MODEL argument to the file name shown in messages and the model's name.
-- "gpt2_124m" -> models/gpt2_124m.lua; anything with a '/' or ending in .lua is a path.
function M.model_file(spec)
    if type(spec) ~= "string" or spec == "" then
        diag.error(nil, "no model given (MODEL=<name>, one of the files in models/)")
    end
    local file = spec
    if not spec:find("/", 1, true) and not spec:find("%.lua$") then
        file = "models/" .. spec .. ".lua"
    end
    local name = file:match("([^/]+)%.lua$")
    if not name then
        diag.error(nil, "model '%s' is not a .lua file", spec)
    end
    if not name:match("^[%w_.-]+$") then
        diag.error(nil, "model name '%s' may only use letters, digits, '_', '.' and '-'", name)
    end
    return file, name
end

-- Read a model file: as given (relative to the current directory), else relative to the
-- repository root. The root itself never appears in messages.
local function read_model(file)
    local f = io.open(file, "rb")
    if not f and file:sub(1, 1) ~= "/" then
        f = io.open(host.root() .. "/" .. file, "rb")
    end
    if not f then
        diag.error(nil, "cannot read model %s: no such file (models are in models/)", file)
    end
    local src, why = f:read(sandbox.SOURCE + 1)    -- more is refused by sandbox.run
    f:close()
    if not src and why then diag.error(nil, "cannot read model %s: %s", file, why) end
    return src or ""
end

-- Evaluate model source 'src' (shown as 'file', named 'name') and validate it -> Model.
function M.model_from_source(src, file, name)
    local marks = setmetatable({}, { __mode = "k" })   -- constructed tables -> "gpt" | "llama"
                                                        -- | "moe"
    local calls, seen = {}, { gpt = 0, llama = 0, moe = 0 }
    local function constructor(kind)
        return function(t)
            -- 'return gpt { ... }' is a tail call: the caller's frame is gone, and the line is
            -- found later by scanning the source for the n-th call of this constructor.
            local info = debug.getinfo(1, "t").istailcall and nil or debug.getinfo(2, "l")
            seen[kind] = seen[kind] + 1
            local line = info and info.currentline > 0 and info.currentline or nil
            local obj = {}
            marks[obj] = kind
            calls[obj] = { fields = t, line = line, kind = kind, nth = seen[kind] }
            return obj
        end
    end
    local result = sandbox.run(src, file, { gpt = constructor("gpt"), llama = constructor("llama"),
                                            moe = constructor("moe") })
    local arch = type(result) == "table" and marks[result]
    if arch ~= "gpt" and arch ~= "llama" then
        diag.error({ file = file, line = 1 },
                   "a model description must end with 'return gpt { ... }' or " ..
                   "'return llama { ... }' (it returned %s)",
                   result == nil and "nothing" or type(result) == "table" and
                   "a table not made by gpt{ } or llama{ }" or show(result))
    end

    local code = code_only(src)
    for _, c in pairs(calls) do
        c.line = c.line or call_line(code, c.kind, c.nth)
    end
    local probs = {}
    for _, d in ipairs(duplicate_keys(code, src)) do
        probs[#probs + 1] = { d.line, string.format(
            "key '%s' is given twice in this table (first at line %d)", key_name(d.key), d.first) }
    end
    local call = calls[result]
    local function check_table(c)
        -- the only tables with metatables a model can reach are the library views and _ENV,
        -- whose __index would raise in the middle of check_fields
        if type(c.fields) ~= "table" or getmetatable(c.fields) ~= nil then
            diag.error({ file = file, line = c.line }, "%s expects a table: %s { ... } (got %s)",
                       c.kind, c.kind, type(c.fields) == "table" and
                       "a library or environment table" or show(c.fields))
        end
    end
    check_table(call)
    if moe_call(calls, call) then check_table(moe_call(calls, call)) end
    local llama = arch == "llama"
    local g = check_fields(call, llama and LLAMA_KEYS or GPT_KEYS, arch, probs, code, marks)
    local mcall, m = nil, nil
    if g.moe then
        mcall = calls[g.moe]
        m = check_fields(mcall, MOE_KEYS, "moe", probs, code, marks)
    end
    local function at(k) return call.lines[k] or call.line end
    if g.hidden and g.heads and g.hidden % g.heads ~= 0 then
        probs[#probs + 1] = { at("heads"), string.format(
            "hidden (%d) must be divisible by heads (%d)", g.hidden, g.heads) }
    end
    if llama and g.heads and g.kv_heads and g.heads % g.kv_heads ~= 0 then
        probs[#probs + 1] = { at("kv_heads"), string.format(
            "kv_heads (%d) must divide heads (%d): each kv head serves heads/kv_heads query heads",
            g.kv_heads, g.heads) }
    end
    local hd = g.hidden and g.heads and g.hidden % g.heads == 0 and g.hidden // g.heads
    if llama and hd and hd % 2 ~= 0 then
        probs[#probs + 1] = { at("heads"), string.format(
            "rotary embeddings need an even head size: hidden/heads = %d/%d = %d is odd",
            g.hidden, g.heads, g.hidden // g.heads) }
    end
    if m and m.bias ~= nil then
        probs[#probs + 1] = { mcall.lines.bias or mcall.line, llama and
            "llama{} experts have no biases (Mixtral's w1, w2, w3): remove bias from moe{}" or
            "moe{} takes no 'bias': as in Megatron, add_bias_linear in gpt{} (default true) " ..
            "gives biases to every linear layer, the router's and the experts' included" }
    end
    if m and m.top_k and m.experts and m.top_k > m.experts then
        probs[#probs + 1] = { mcall.lines.top_k or mcall.line, string.format(
            "top_k (%d) must not exceed experts (%d)", m.top_k, m.experts) }
    end
    local lb = m and m.load_balancing
    if lb ~= nil and lb ~= "aux_loss" and lb ~= "seq_aux_loss" and lb ~= "none" then
        probs[#probs + 1] = { mcall.lines.load_balancing or mcall.line, string.format(
            "load_balancing must be \"aux_loss\", \"seq_aux_loss\" or \"none\" (got %s; " ..
            "Megatron's sinkhorn and global_aux_loss are not supported)", show(lb)) }
    end
    if m and m.drop_policy ~= nil and m.drop_policy ~= "probs" and m.drop_policy ~= "position"
    then
        probs[#probs + 1] = { mcall.lines.drop_policy or mcall.line, string.format(
            "drop_policy must be \"probs\" or \"position\" (got %s)", show(m.drop_policy)) }
    end
    for _, k in ipairs({ "drop_policy", "pad_to_capacity" }) do
        if m and m[k] ~= nil and not m.capacity_factor then
            probs[#probs + 1] = { mcall.lines[k] or mcall.line, string.format(
                "%s needs capacity_factor (Megatron's moe_expert_capacity_factor): without " ..
                "it no token is dropped or padded", k) }
        end
    end
    local sf = m and m.score_function
    if sf ~= nil and sf ~= "softmax" and sf ~= "sigmoid" then
        probs[#probs + 1] = { mcall.lines.score_function or mcall.line, string.format(
            "score_function must be \"softmax\" or \"sigmoid\" (got %s; Megatron's " ..
            "sqrtsoftplus is not supported)", show(sf)) }
    end
    if sf == "sigmoid" and m.z_loss_coeff and m.z_loss_coeff > 0 then
        probs[#probs + 1] = { mcall.lines.z_loss_coeff or mcall.line,
            "z_loss_coeff with score_function = \"sigmoid\" is not supported yet (the " ..
            "programs keep the sigmoid scores, not the softmax the z-loss needs)" }
    end
    if m and m.expert_bias and sf ~= "sigmoid" then
        probs[#probs + 1] = { mcall.lines.expert_bias or mcall.line,
            "expert_bias needs score_function = \"sigmoid\" (Megatron: \"Expert bias for " ..
            "aux-loss-free routing only supports sigmoid score function\")" }
    end
    if m and m.bias_update_rate ~= nil and not m.expert_bias then
        probs[#probs + 1] = { mcall.lines.bias_update_rate or mcall.line,
            "bias_update_rate needs expert_bias = true (Megatron's " ..
            "moe_router_bias_update_rate only updates the expert bias)" }
    end
    if m and (m.num_groups ~= nil) ~= (m.group_topk ~= nil) then
        local k = m.num_groups and "num_groups" or "group_topk"
        probs[#probs + 1] = { mcall.lines[k] or mcall.line, m.group_topk and
            "group_topk needs num_groups (Megatron: \"When using group limited routing, " ..
            "moe_router_num_groups must be specified\")" or
            "num_groups alone does nothing (Megatron ignores it without group_topk): give " ..
            "group_topk too, or remove num_groups" }
    elseif m and m.num_groups and m.experts and m.group_topk and m.top_k then
        local at = mcall.lines.num_groups or mcall.line
        if m.experts % m.num_groups ~= 0 then
            probs[#probs + 1] = { at, string.format("experts (%d) must be divisible by " ..
                "num_groups (%d)", m.experts, m.num_groups) }
        elseif m.group_topk > m.num_groups then
            probs[#probs + 1] = { mcall.lines.group_topk or at, string.format(
                "group_topk (%d) must not exceed num_groups (%d)", m.group_topk, m.num_groups) }
        elseif m.group_topk * (m.experts // m.num_groups) < m.top_k then
            probs[#probs + 1] = { mcall.lines.group_topk or at, string.format(
                "group_topk (%d) groups of %d experts cannot hold top_k (%d) choices",
                m.group_topk, m.experts // m.num_groups, m.top_k) }
        end
    end
    if m and m.top_k == 1 and not m.pre_softmax and sf ~= "sigmoid" then
        probs[#probs + 1] = { mcall.lines.top_k or mcall.line,
            "top_k = 1 needs pre_softmax = true (Megatron: \"Please use " ..
            "--moe-router-pre-softmax when topk is 1\"): a softmax over the one chosen " ..
            "logit is always 1 and gives the router a zero gradient" }
    end
    if #probs > 0 then
        table.sort(probs, function(a, b)
            if a[1] ~= b[1] then return a[1] < b[1] end
            return a[2] < b[2]
        end)
        local c = diag.collect()
        for _, p in ipairs(probs) do c.add({ file = file, line = p[1] }, "%s", p[2]) end
        c.raise()
    end

    local ffn = g.ffn_hidden or 4 * g.hidden
    local moe
    if m then
        moe = ir.Moe {
            experts = m.experts, top_k = m.top_k, ffn_hidden = m.ffn_hidden or ffn,
            aux_loss_coeff = m.aux_loss_coeff or 0.0, z_loss_coeff = m.z_loss_coeff or 0.0,
            load_balancing = m.load_balancing or "aux_loss",
            topk_scaling_factor = m.topk_scaling_factor,
            score_function = m.score_function or "softmax",
            num_groups = m.num_groups, group_topk = m.group_topk,
            pre_softmax = m.pre_softmax or false,
            capacity_factor = m.capacity_factor, drop_policy = m.drop_policy or "probs",
            pad_to_capacity = m.pad_to_capacity or false,
            expert_bias = m.expert_bias or false,
            bias_update_rate = m.bias_update_rate or 1e-3,
            shared_expert_ffn = m.shared_expert_ffn,
            bias = not llama and g.add_bias_linear ~= false,
            line = mcall.line, lines = mcall.lines,
        }
    end
    local model = ir.Model {
        name = name, file = file, line = call.line, lines = call.lines,
        description = g.description, layers = g.layers, hidden = g.hidden, heads = g.heads,
        head_dim = g.hidden // g.heads, seq_len = g.seq_len, vocab = g.vocab,
        ffn_hidden = ffn, norm_eps = g.norm_eps or 1e-5, init_std = g.init_std or 0.02,
        vocab_pad = g.vocab_pad or 128, moe = moe, arch = arch,
        bias = not llama and g.add_bias_linear ~= false,
        kv_heads = llama and (g.kv_heads or g.heads) or g.heads,
        rope_theta = llama and (g.rope_theta or 10000.0) + 0.0 or nil,
        tie_embeddings = not llama or g.tie_embeddings == true,
    }
    -- Exact integer counts need headroom: estimate in floating point first.
    local C, F = model.hidden + 0.0, model.ffn_hidden + 0.0
    local mats = llama and 3 or 2       -- SwiGLU: gate, up, down
    local per_layer = 4 * C * C + mats * C * F
    if moe then per_layer = 4 * C * C + moe.experts * (C + mats * C * moe.ffn_hidden) end
    local approx = model.layers * per_layer + (model.vocab * (model.tie_embeddings and 1 or 2)
                                               + model.seq_len) * C
    if approx > M.MAX_PARAMS then
        diag.error({ file = file, line = call.line },
                   "model has about %.3g parameters; the generator handles at most %.3g",
                   approx, M.MAX_PARAMS + 0.0)
    end
    return model
end

-- Load MODEL (a name or a path) -> Model.
function M.load_model(spec)
    local file, name = M.model_file(spec)
    return M.model_from_source(read_model(file), file, name)
end

-- -- Sizes -----------------------------------------------------------------------------------

-- A layout's part of a directory name: its virtual stages as E, t<n>, L (empty: 0), joined
-- by '_', runs of equal stages as <stage>x<n>: "E|t*4|t*4|L" -> "E_t4x2_L".
local function layout_name(layout)
    local stages = partition.parse_layout(layout)
    local words = {}
    for _, st in ipairs(stages) do
        local w = (st.E > 0 and "E" or "") .. (st.t > 0 and ("t" .. st.t) or "")
                  .. (st.m > 0 and ("m" .. st.m) or "") .. (st.L > 0 and "L" or "")
        words[#words + 1] = w == "" and "0" or w
    end
    local out, i = {}, 1
    while i <= #words do
        local j = i
        while j < #words and words[j + 1] == words[i] do j = j + 1 end
        out[#out + 1] = words[i] .. (j > i and ("x" .. (j - i + 1)) or "")
        i = j + 1
    end
    return table.concat(out, "_")
end

-- Output directory name and regenerate command (DESIGN 4.3): defaults are left out.
local function naming(model, s)
    local dir = { string.format("%s-tp%d-pp%d-dp%d", model.name, s.tp, s.pp, s.dp) }
    local mk = { "make MODEL=" .. (model.file == "models/" .. model.name .. ".lua"
                                   and model.name or model.file),
                 string.format("TP=%d PP=%d DP=%d", s.tp, s.pp, s.dp) }
    local function opt(cond, d, m)
        if cond then dir[#dir + 1] = d; mk[#mk + 1] = m end
    end
    opt(s.cp ~= 1, "-cp" .. s.cp, "CP=" .. s.cp)
    opt(s.cp_comm ~= "p2p", "-a2a", "CP_COMM=" .. s.cp_comm)
    opt(s.ep ~= 1, "-ep" .. s.ep, "EP=" .. s.ep)
    opt(s.etp ~= s.tp, "-etp" .. s.etp, "ETP=" .. s.etp)
    opt(s.vp ~= 1, "-vp" .. s.vp, "VP=" .. s.vp)
    opt(s.mbs ~= 1, "-mbs" .. s.mbs, "MBS=" .. s.mbs)
    opt(s.nmb ~= 1, "-nmb" .. s.nmb, "NMB=" .. s.nmb)
    opt(s.seq ~= model.seq_len, "-seq" .. s.seq, "SEQ=" .. s.seq)
    opt(s.sp, "-sp", "SP=1")
    opt(s.dist_opt, "-distopt", "DIST_OPT=1")
    opt(s.bf16, "-bf16", "BF16=1")
    opt(not s.overlap, "-nooverlap", "OVERLAP=0")
    opt(s.bucket ~= nil, "-bucket" .. tostring(s.bucket), "BUCKET_SIZE=" .. tostring(s.bucket))
    local rc = s.rc
    if rc.granularity == "selective" then
        local mods = table.concat(rc.modules, ",")
        opt(true, "-rcsel" .. (mods ~= "core_attn" and "-" .. mods:gsub("_", ""):gsub(",", "-")
                              or ""),
            "RECOMPUTE=selective" .. (mods ~= "core_attn" and " RECOMPUTE_MODULES=" .. mods or ""))
    elseif rc.granularity == "full" then
        opt(true, string.format("-rc%s%d", rc.method, rc.layers),
            string.format("RECOMPUTE=full RECOMPUTE_METHOD=%s RECOMPUTE_LAYERS=%d", rc.method,
                          rc.layers))
    end
    opt(s.first_layers ~= nil, "-first" .. tostring(s.first_layers),
        "FIRST_LAYERS=" .. tostring(s.first_layers))
    opt(s.last_layers ~= nil, "-last" .. tostring(s.last_layers),
        "LAST_LAYERS=" .. tostring(s.last_layers))
    opt(s.account_embedding, "-acce", "ACCOUNT_EMBEDDING=1")
    opt(s.account_loss, "-accl", "ACCOUNT_LOSS=1")
    opt(s.mb_group ~= nil, "-mbg" .. tostring(s.mb_group),
        "MICROBATCH_GROUP=" .. tostring(s.mb_group))
    if s.layout ~= nil then
        opt(true, "-layout-" .. layout_name(s.layout), "LAYOUT='" .. s.layout .. "'")
    end
    opt(s.order ~= M.DEFAULT_ORDER, "-order" .. s.order, "ORDER=" .. s.order)
    return table.concat(dir), table.concat(mk, " ")
end

-- Parse ORDER -> list of axis names, or nil after adding problems to 'errs'.
local function parse_order(order, errs)
    local list, seen, ok = {}, {}, true
    for part in (order .. "-"):gmatch("([^-]*)-") do
        if part == "" then
            errs.add(nil, "ORDER '%s' has an empty axis name (write axes joined by '-', e.g. %s)",
                     order, M.DEFAULT_ORDER)
            ok = false
        elseif not M.AXES[part] then
            errs.add(nil, "ORDER '%s' names an unknown axis '%s' (axes: tp, cp, ep, dp, pp)",
                     order, part)
            ok = false
        elseif seen[part] then
            errs.add(nil, "ORDER '%s' names '%s' twice", order, part)
            ok = false
        end
        seen[part] = true
        list[#list + 1] = part
    end
    return ok and list or nil
end

-- Rank stride of axis 'name' when 'sizes' are laid out in 'axes' order.
local function stride_of(axes, sizes, name)
    local s = 1
    for _, a in ipairs(axes) do
        if a == name then return s end
        s = s * sizes[a]
    end
end

-- The most layers a model chunk holds (a stage's layers over VP), for the recompute range;
-- nil when the placement itself is invalid (reported elsewhere).
local function max_chunk_layers(L, P, V, f, l)
    if not (f or l) then return L // (P * V) end
    local Pm = P - (f and 1 or 0) - (l and 1 or 0)
    local most = math.max(f or 0, l or 0)
    if Pm > 0 then most = math.max(most, (L - (f or 0) - (l or 0)) // Pm) end
    return most // V
end

-- Check a parsed layout 'stages' of string 'layout' (Megatron's validate_layer_layout, and
-- where these programs need the embedding and the loss); problems go to 'errs' (layer-count
-- ones at 'lat'). Returns the most transformer layers a virtual stage holds, or nil.
local function layout_problems(layout, stages, P, L, lat, errs)
    local n, most = { E = 0, t = 0, m = 0, L = 0 }, 0
    local first, last          -- first and last placed element, in string order
    for s, st in ipairs(stages) do
        for _, k in ipairs({ "E", "t", "m", "L" }) do n[k] = n[k] + st[k] end
        if st.t > most then most = st.t end
        local any = st.E + st.t + st.m + st.L > 0
        if any and not first then
            first = st.E > 0 and s or -s
            if st.E > 0 and st.text:sub(1, 1) ~= "E" then first = -s end
        end
        if any then last = (st.L > 0 and st.text:sub(-1) == "L") and s or -s end
    end
    local before = errs.count()
    if n.m > 0 then
        errs.add(nil, "LAYOUT '%s' places %d MTP layer%s ('m'): multi-token prediction is " ..
                 "not supported (remove the m's)", layout, n.m, n.m == 1 and "" or "s")
    end
    if n.E ~= 1 then
        errs.add(nil, "LAYOUT '%s' must place the embedding E exactly once (it has %d)",
                 layout, n.E)
    elseif first ~= 1 then
        errs.add(nil, "LAYOUT '%s' must start with the embedding E in its first virtual " ..
                 "stage (pp rank 0, chunk 0), where the schedule feeds the tokens", layout)
    end
    if n.L ~= 1 then
        errs.add(nil, "LAYOUT '%s' must place the loss L exactly once (it has %d)", layout, n.L)
    elseif last ~= #stages then
        errs.add(nil, "LAYOUT '%s' must end with the loss L in its last virtual stage (pp " ..
                 "rank %d, chunk %d), where the schedule ends", layout, P - 1,
                 #stages // P - 1)
    end
    if n.t ~= L then
        errs.add(lat, "LAYOUT '%s' places %d transformer layers ('t'), but the model has %d",
                 layout, n.t, L)
    end
    return errs.count() == before and most or nil
end

M.RECOMPUTE_MODULES = { "core_attn", "layernorm", "mlp" }
-- Megatron's --recompute-modules choices that the programs do not implement.
local MEGATRON_ONLY_MODULES = { moe_act = "needs grouped expert GEMMs",
    mla_up_proj = "needs multi-latent attention", moe = "recomputing the MoE layer",
    shared_experts = "recomputing the shared expert" }

-- RECOMPUTE, RECOMPUTE_METHOD, RECOMPUTE_LAYERS and RECOMPUTE_MODULES as Megatron's
-- TransformerConfig checks them (docs/megatron.md §9.2) -> { granularity = "none" | "selective"
-- | "full", method, layers, modules }; problems go to 'errs'.
local function recompute_options(opts, errs, most, model)
    local g, method, n, mods = opts.recompute, opts.recompute_method, opts.recompute_layers,
                               opts.recompute_modules
    local rc = { granularity = "none", modules = {} }
    if g == nil then
        if method ~= nil or n ~= nil or mods ~= nil then
            errs.add(nil, "%s needs RECOMPUTE (selective or full)",
                     method ~= nil and "RECOMPUTE_METHOD" or n ~= nil and "RECOMPUTE_LAYERS"
                     or "RECOMPUTE_MODULES")
        end
        return rc
    end
    if g ~= "selective" and g ~= "full" then
        errs.add(nil, "RECOMPUTE '%s' must be selective or full (Megatron's " ..
                 "--recompute-granularity)", g)
        return rc
    end
    rc.granularity = g
    if method ~= nil and method ~= "uniform" and method ~= "block" then
        errs.add(nil, "RECOMPUTE_METHOD '%s' must be uniform or block", method)
    elseif g == "full" and method == nil then
        errs.add(nil, "RECOMPUTE=full needs RECOMPUTE_METHOD=uniform (groups of " ..
                 "RECOMPUTE_LAYERS layers) or block (the first RECOMPUTE_LAYERS layers of " ..
                 "each chunk)")
    elseif g == "selective" and method ~= nil then
        errs.add(nil, "RECOMPUTE_METHOD applies to RECOMPUTE=full only (selective recomputes " ..
                 "in every layer)")
    end
    rc.method = method
    if g == "selective" and n ~= nil then
        errs.add(nil, "RECOMPUTE_LAYERS applies to RECOMPUTE=full only (Megatron: " ..
                 "recompute_num_layers must be None with selective)")
    elseif g == "full" and most then
        if n == nil then
            errs.add(nil, "RECOMPUTE=full needs RECOMPUTE_LAYERS between 1 and %d (the " ..
                     "layers of a model chunk)", most)
        elseif n < 1 or n > most then
            errs.add(nil, "RECOMPUTE_LAYERS (%d) must be between 1 and %d, the layers of a " ..
                     "model chunk (%d layers over PP %d%s)", n, most, model.layers,
                     opts.pp or 1, (opts.vp or 1) > 1 and " and VP " .. opts.vp or "")
        end
    end
    rc.layers = n
    if g == "full" and mods ~= nil then
        errs.add(nil, "RECOMPUTE_MODULES applies to RECOMPUTE=selective only (full " ..
                 "recomputes whole layers)")
    elseif g == "selective" then
        local seen = {}
        for name in ((mods or "core_attn") .. ","):gmatch("([^,]*),") do
            local ok = false
            for _, m in ipairs(M.RECOMPUTE_MODULES) do ok = ok or m == name end
            if name == "" then
                errs.add(nil, "RECOMPUTE_MODULES '%s' has an empty name (write names joined " ..
                         "by ',', e.g. core_attn,mlp)", mods)
            elseif MEGATRON_ONLY_MODULES[name] then
                errs.add(nil, "RECOMPUTE_MODULES: '%s' is not supported (%s); supported: %s",
                         name, MEGATRON_ONLY_MODULES[name],
                         table.concat(M.RECOMPUTE_MODULES, ", "))
            elseif not ok then
                errs.add(nil, "RECOMPUTE_MODULES: unknown module '%s' (one of: %s)", name,
                         table.concat(M.RECOMPUTE_MODULES, ", "))
            elseif seen[name] then
                errs.add(nil, "RECOMPUTE_MODULES names '%s' twice", name)
            elseif name == "mlp" and model.moe then
                errs.add(nil, "RECOMPUTE_MODULES: 'mlp' recomputes the dense MLP, and %s " ..
                         "has experts in its place", model.file)
            else
                seen[name] = true
            end
        end
        -- in the order of M.RECOMPUTE_MODULES: one spelling per set, one directory name
        for _, m in ipairs(M.RECOMPUTE_MODULES) do
            if seen[m] then rc.modules[#rc.modules + 1] = m end
        end
    end
    return rc
end

-- Validate sizes 'opts' against 'model' -> Config. No I/O but the warning it may print.
function M.configure(model, opts)
    local errs = diag.collect()
    local function model_at(key, moe)
        local rec = moe and model.moe or model
        return { file = model.file, line = rec.lines[key] or rec.line }
    end

    -- Every size is an integer >= 1 (RANK >= 0).
    local function size(key, name, default)
        local v = opts[key]
        if v == nil then return default end
        if math.type(v) ~= "integer" then
            errs.add(nil, "%s must be an integer (got %s)", name, tostring(v))
            return default
        elseif v < 1 then
            errs.add(nil, "%s must be at least 1 (got %d)", name, v)
            return default
        elseif v > M.MAX_SIZE then
            errs.add(nil, "%s (%d) is too large (at most %d)", name, v, M.MAX_SIZE)
            return default
        end
        return v
    end
    local T, P, D = size("tp", "TP", 1), size("pp", "PP", 1), size("dp", "DP", 1)
    local C, E, V = size("cp", "CP", 1), size("ep", "EP", 1), size("vp", "VP", 1)
    local Te = size("etp", "ETP", T)
    local mbs, nmb = size("mbs", "MBS", 1), size("nmb", "NMB", 1)
    -- GBS (Megatron's --global-batch-size, in sequences): the micro-batches it takes
    local gbs = size("gbs", "GBS", nil)
    if gbs and opts.nmb ~= nil and gbs ~= mbs * D * nmb then
        errs.add(nil, "GBS (%d) and NMB (%d) disagree: MBS (%d) x DP (%d) x NMB = %d; give " ..
                 "one of them", gbs, nmb, mbs, D, mbs * D * nmb)
    elseif gbs and gbs % (mbs * D) ~= 0 then
        local per = mbs * D
        local lo, hi = gbs - gbs % per, gbs - gbs % per + per
        errs.add(nil, "GBS (%d) must be a multiple of MBS (%d) x DP (%d) = %d (use %s)", gbs,
                 mbs, D, per, lo > 0 and ("GBS=%d or GBS=%d"):format(lo, hi)
                 or ("GBS=%d"):format(hi))
    elseif gbs then
        nmb = gbs // (mbs * D)
    end
    if nmb > M.MAX_NMB then
        errs.add(nil, "NMB (%d) is too large (at most %d: the generated schedule lists every " ..
                 "micro-batch; for a larger batch raise MBS or DP)", nmb, M.MAX_NMB)
        nmb = 1
    end
    local seq = size("seq", "SEQ", model.seq_len)
    -- Gradient buckets (docs/megatron.md §5.1): with overlap, Megatron's --ddp-bucket-size or
    -- its default max(40M, 1M * the dp-cp size); without, one bucket per buffer
    local bucket = opts.bucket_size
    if bucket ~= nil then
        if math.type(bucket) ~= "integer" or bucket < 1 then
            errs.add(nil, "BUCKET_SIZE must be a positive number of elements (got %s)",
                     tostring(bucket))
            bucket = nil
        elseif opts.no_overlap then
            errs.add(nil, "BUCKET_SIZE (%d) needs the overlap: without it (OVERLAP=0) each " ..
                     "buffer is one bucket, as in Megatron; drop one of them", bucket)
            bucket = nil
        end
    end
    local function layers_opt(key, name)
        if opts[key] == 0 then
            errs.add(nil, "%s must be at least 1 (got 0): a pipeline stage with no layers is " ..
                     "not allowed", name)
            return nil
        end
        return size(key, name, nil)
    end
    local f = layers_opt("first_layers", "FIRST_LAYERS")
    local l = layers_opt("last_layers", "LAST_LAYERS")
    local Ng = size("microbatch_group", "MICROBATCH_GROUP", nil)
    local acc_e, acc_l = opts.account_embedding == true, opts.account_loss == true
    -- LAYOUT (Megatron's --pipeline-model-parallel-layout) gives VP: its stages over PP.
    local layout, lstages = opts.layout, nil
    if layout ~= nil then
        local why
        lstages, why = partition.parse_layout(tostring(layout))
        if not lstages then
            errs.add(nil, "LAYOUT '%s' %s", layout, why)
        elseif #lstages % P ~= 0 then
            errs.add(nil, "LAYOUT '%s' has %d virtual stages, which must be a multiple of " ..
                     "PP (%d): stage s runs on pp rank s %% PP as chunk s / PP", layout,
                     #lstages, P)
            lstages = nil
        elseif opts.vp ~= nil then
            errs.add(nil, "VP cannot be given with LAYOUT: the layout's %d virtual stages " ..
                     "over PP %d give VP = %d (Megatron: at most one of " ..
                     "--num-virtual-stages-per-pipeline-rank and " ..
                     "--pipeline-model-parallel-layout)", #lstages, P, #lstages // P)
        else
            V = #lstages // P
        end
    end
    local cp_comm = opts.cp_comm or "p2p"
    if cp_comm ~= "p2p" and cp_comm ~= "a2a" then
        errs.add(nil, "CP_COMM '%s' is not p2p (K and V around the ring, the default) or a2a " ..
                 "(all-to-all of heads and sequence)", tostring(cp_comm))
        cp_comm = "p2p"
    end
    local order = string.lower(opts.order or M.DEFAULT_ORDER)
    local listed = parse_order(order, errs)
    if errs.count() > 0 then errs.raise() end

    local world = T * C * D * P
    if world > M.MAX_SIZE then
        diag.error(nil, "world size %d (TP*CP*DP*PP = %d*%d*%d*%d) is too large (at most %d)",
                   world, T, C, D, P, M.MAX_SIZE)
    end

    -- megatron initialize_model_parallel, in its order.
    if V > 1 and P == 1 and layout ~= nil then
        errs.add(nil, "LAYOUT '%s' has %d virtual stages, which need PP > 1 (with PP 1 it " ..
                 "would make VP %d: the interleaved schedule runs chunks across pipeline " ..
                 "stages)", layout, V, V)
    elseif V > 1 and P == 1 then
        errs.add(nil, "VP (%d) needs PP > 1: the interleaved schedule splits each pipeline " ..
                 "stage into VP chunks", V)
    end
    local in_order, reported = {}, {}
    for _, a in ipairs(listed) do in_order[a] = true end
    local axes = util.copy(listed)              -- the order Megatron's generators use
    for _, a in ipairs(M.APPEND_ORDER) do
        if not in_order[a] then axes[#axes + 1] = a end
    end
    local dense = { tp = T, cp = C, ep = 1, dp = D, pp = P }
    local function missing(sizes, names)
        for _, a in ipairs(M.APPEND_ORDER) do
            if not in_order[a] and sizes[a] > 1 and not reported[a] then
                reported[a] = true
                errs.add(nil, "ORDER '%s' does not name %s, but %s is %d (every axis larger " ..
                         "than 1 must appear; the default is %s)", order, a, names[a], sizes[a],
                         M.DEFAULT_ORDER)
            end
        end
    end
    missing(dense, { tp = "TP", cp = "CP", dp = "DP", pp = "PP" })
    local etmp = Te * E * P
    local De
    if world % etmp ~= 0 then
        errs.add(nil, "the world (TP*CP*DP*PP = %d) is not divisible by ETP*EP*PP = " ..
                 "%d*%d*%d = %d (choose EP and ETP so that ETP*EP*PP divides %d)", world, Te, E,
                 P, etmp, world)
    else
        De = world // etmp
        local expert = { tp = Te, cp = 1, ep = E, dp = De, pp = P }
        missing(expert, { tp = "ETP", ep = "EP", dp = "EDP (world/(ETP*EP*PP))", pp = "PP" })
        if listed[#listed] ~= "pp" and P > 1 and De ~= D then
            errs.add(nil, "ORDER '%s' does not end with pp, so the expert data-parallel size " ..
                     "EDP = %d must equal DP = %d (put pp last, or choose EP/ETP so that EDP = DP)",
                     order, De, D)
        elseif P > 1 then
            local sd, se = stride_of(axes, dense, "pp"), stride_of(axes, expert, "pp")
            if sd ~= se then
                errs.add(nil, "ORDER '%s' gives the attention and expert grids different " ..
                         "pipeline groups (next stage %d ranks away vs %d); put pp last",
                         order, sd, se)
            end
        end
    end

    -- ModelParallelConfig / arguments.py / TransformerConfig rules.
    if opts.sp and T == 1 then
        errs.add(nil, "SP needs TP > 1: sequence parallelism splits the sequence over the " ..
                 "tensor-parallel group")
    end
    local moe = model.moe
    if not moe and E > 1 then
        errs.add(nil, "EP (%d) > 1 needs a model with experts (%s has no moe{ })", E, model.file)
    end
    if model.heads % T ~= 0 then
        errs.add(model_at("heads"), "heads (%d) must be divisible by TP (%d)", model.heads, T)
    end
    if model.kv_heads ~= model.heads and model.kv_heads % T ~= 0 then
        errs.add(model_at("kv_heads"), "TP (%d) must divide kv_heads (%d): each tp rank holds " ..
                 "kv_heads/TP key/value heads (Megatron can also replicate kv heads when TP > " ..
                 "kv_heads; these programs do not: use TP dividing %d)", T, model.kv_heads,
                 model.kv_heads)
    end
    if model.ffn_hidden % T ~= 0 then
        errs.add(model_at("ffn_hidden"), "ffn_hidden (%d) must be divisible by TP (%d)",
                 model.ffn_hidden, T)
    end
    if moe then
        if moe.experts % E ~= 0 then
            errs.add(model_at("experts", true), "experts (%d) must be divisible by EP (%d)",
                     moe.experts, E)
        end
        if moe.ffn_hidden % Te ~= 0 then
            errs.add(model_at("ffn_hidden", true),
                     "expert ffn_hidden (%d) must be divisible by ETP (%d)", moe.ffn_hidden, Te)
        end
        local Fs = moe.shared_expert_ffn
        if Fs and Fs % T ~= 0 then     -- tensor-parallel like the dense MLP (TP, not ETP)
            errs.add(model_at("shared_expert_ffn", true),
                     "shared_expert_ffn (%d) must be divisible by TP (%d): the shared expert " ..
                     "is split over tp like the dense MLP", Fs, T)
        end

        if moe.bias and Te > 1 then
            errs.add(model_at("add_bias_linear"), "ETP is %d, and %s's experts have biases " ..
                     "(add_bias_linear, default true): Megatron refuses it (\"Bias in Moe is " ..
                     "only supported when ETP==1\"); set add_bias_linear = false in gpt{}, or " ..
                     "ETP=1", Te, model.name)
        end
    end

    if C > M.MAX_CP then
        errs.add(nil, "CP (%d) is too large (at most %d)", C, M.MAX_CP)
    end
    if opts.cp_comm and C == 1 then
        errs.add(nil, "CP_COMM=%s needs CP > 1 (it chooses how context-parallel ranks " ..
                 "exchange attention inputs)", cp_comm)
    end
    if cp_comm == "a2a" and C > 1 and model.heads % T == 0 and (model.heads // T) % C ~= 0 then
        errs.add(model_at("heads"), "CP_COMM=a2a needs the heads per tp rank (heads/TP = %d/%d " ..
                 "= %d) divisible by CP (%d): the all-to-all gives each cp rank heads/(TP*CP) " ..
                 "heads of the whole sequence (use CP_COMM=p2p, or another CP or TP)",
                 model.heads, T, model.heads // T, C)
    end
    local kvl = model.kv_heads // T
    if cp_comm == "a2a" and C > 1 and model.kv_heads % T == 0 and kvl % C ~= 0 then
        errs.add(model_at("kv_heads"), "CP_COMM=a2a needs the kv heads per tp rank " ..
                 "(kv_heads/TP = %d/%d = %d) divisible by CP (%d): each cp rank attends with " ..
                 "kv_heads/(TP*CP) kv heads of the whole sequence (use CP_COMM=p2p, or " ..
                 "another CP or TP)", model.kv_heads, T, kvl, C)
    end

    -- Sequence length.
    local seq_at = (opts.seq == nil) and model_at("seq_len") or nil
    if seq > model.seq_len then
        errs.add(model_at("seq_len"), "SEQ (%d) must not exceed seq_len (%d)", seq, model.seq_len)
    elseif C > 1 and seq % (2 * C) ~= 0 then
        errs.add(seq_at, "%s (%d) must be divisible by 2*CP = %d (context parallelism cuts " ..
                 "the sequence into 2*CP chunks)", opts.seq and "SEQ" or "seq_len", seq, 2 * C)
    elseif opts.sp and T > 1 and C > 1 and seq % (2 * C * T) ~= 0 then
        errs.add(seq_at, "with SP and CP, %s (%d) must be divisible by 2*CP*TP = %d (each cp " ..
                 "rank's two chunks are split over tp; choose SEQ accordingly)",
                 opts.seq and "SEQ" or "seq_len", seq, 2 * C * T)
    elseif opts.sp and T > 1 and (seq // C) % T ~= 0 then
        errs.add(seq_at, "with SP, %s/CP = %d must be divisible by TP (%d)",
                 opts.seq and "SEQ" or "seq_len", seq // C, T)
    end

    -- Layer placement (docs/megatron.md §2).
    local L, lat = model.layers, model_at("layers")
    local most          -- the most layers a chunk holds (nil: the placement is invalid)
    if layout ~= nil then
        if f or l or acc_e or acc_l then
            local other = {}
            if f then other[#other + 1] = "FIRST_LAYERS" end
            if l then other[#other + 1] = "LAST_LAYERS" end
            if acc_e then other[#other + 1] = "ACCOUNT_EMBEDDING" end
            if acc_l then other[#other + 1] = "ACCOUNT_LOSS" end
            errs.add(nil, "LAYOUT cannot be combined with %s: the layout places every layer " ..
                     "itself", table.concat(other, " or "))
        end
        if lstages then most = layout_problems(layout, lstages, P, L, lat, errs) end
    elseif (acc_e or acc_l) and (f or l) then
        errs.add(nil, "%s cannot be combined with %s: Megatron counts the embedding and " ..
                 "the loss as layers only in the even split",
                 acc_e and "ACCOUNT_EMBEDDING" or "ACCOUNT_LOSS",
                 f and "FIRST_LAYERS" or "LAST_LAYERS")
    elseif acc_e or acc_l then
        local Lx = L + (acc_e and 1 or 0) + (acc_l and 1 or 0)
        local what = (acc_e and acc_l) and "the embedding and the loss"
                     or acc_e and "the embedding" or "the loss"
        if Lx % P ~= 0 then
            errs.add(lat, "layers (%d) + %d for %s = %d must be divisible by PP (%d) " ..
                     "(ACCOUNT_%s count%s as a layer of the split)", L, Lx - L, what, Lx, P,
                     (acc_e and acc_l) and "EMBEDDING and ACCOUNT_LOSS" or acc_e and
                     "EMBEDDING" or "LOSS", (acc_e and acc_l) and " each" or "s it")
        elseif (Lx // P) % V ~= 0 then
            errs.add(lat, "each stage's %d layers (layers %d + %d for %s, over PP %d) must " ..
                     "be divisible by VP (%d)", Lx // P, L, Lx - L, what, P, V)
        else
            most = Lx // (P * V)
        end
    elseif (f or l) and P == 1 then
        errs.add(nil, "%s needs PP > 1 (an uneven first/last stage needs several stages)",
                 f and "FIRST_LAYERS" or "LAST_LAYERS")
    elseif f or l then
        local Pm = P - (f and 1 or 0) - (l and 1 or 0)
        local Lm = L - (f or 0) - (l or 0)
        local given = (f and l) and string.format("FIRST_LAYERS (%d) + LAST_LAYERS (%d)", f, l)
                      or f and string.format("FIRST_LAYERS (%d)", f)
                      or string.format("LAST_LAYERS (%d)", l)
        local verb = (f and l) and "" or "s"
        if Lm < 0 then
            errs.add(lat, "%s exceed%s layers (%d)", given, verb, L)
        elseif Lm == 0 and Pm > 0 then
            errs.add(lat, "%s leave%s no layers for the other %s (layers is %d)", given, verb,
                     Pm == 1 and "stage" or (Pm .. " stages"), L)
        elseif Lm > 0 and Pm == 0 then
            errs.add(lat, "%s leave %d of %d layers without a stage: with PP %d there are no " ..
                     "middle stages (make them add up to %d)", given, Lm, L, P, L)
        elseif Pm > 0 and Lm % Pm ~= 0 then
            errs.add(lat, "the %d layers left by %s must divide evenly over the %d middle " ..
                     "stage%s (layers is %d)", Lm, given, Pm, Pm == 1 and "" or "s", L)
        elseif V > 1 then
            if f and f % V ~= 0 then
                errs.add(nil, "FIRST_LAYERS (%d) must be divisible by VP (%d)", f, V)
            end
            if l and l % V ~= 0 then
                errs.add(nil, "LAST_LAYERS (%d) must be divisible by VP (%d)", l, V)
            end
            if Pm > 0 and (Lm // Pm) % V ~= 0 then
                errs.add(lat, "each middle stage gets %d layers, which must be divisible by " ..
                         "VP (%d)", Lm // Pm, V)
            end
        end
    elseif L % (P * V) ~= 0 then
        if V == 1 then
            errs.add(lat, "layers (%d) must be divisible by PP (%d)", L, P)
        else
            errs.add(lat, "layers (%d) must be divisible by PP*VP = %d*%d = %d", L, P, V, P * V)
        end
    end
    if layout == nil and not (acc_e or acc_l) then most = max_chunk_layers(L, P, V, f, l) end

    -- Interleaved schedule (docs/megatron.md §3.2): micro-batches in groups of N (default P).
    if Ng and not (V > 1 and P > 1) then
        errs.add(nil, "MICROBATCH_GROUP (%d) applies to the interleaved schedule only " ..
                 "(VP > 1 and PP > 1)", Ng)
    elseif V > 1 and P > 1 then
        local N = Ng or P
        if not Ng and nmb % P ~= 0 then
            local fits             -- the smallest group size Megatron accepts with this NMB
            for n = P, nmb do
                if not fits and (nmb % n == 0 or nmb % n >= P) then fits = n end
            end
            local use = nmb < P and string.format("NMB=%d", P)
                or string.format("NMB=%d or NMB=%d", nmb - nmb % P, nmb - nmb % P + P)
            errs.add(nil, "with VP > 1, NMB (%d) must be a multiple of PP (%d): the " ..
                     "interleaved schedule runs micro-batches in groups of MICROBATCH_GROUP, " ..
                     "by default PP (use %s%s)", nmb, P, use,
                     fits and string.format(", or MICROBATCH_GROUP=%d", fits) or "")
        elseif N < P or N > nmb then
            errs.add(nil, "MICROBATCH_GROUP (%d) must be between PP (%d) and NMB (%d): " ..
                     "Megatron requires the contiguous micro-batches of a virtual stage to " ..
                     "range in [PP, NMB]", N, P, nmb)
        elseif nmb % N ~= 0 and nmb % N < P then
            errs.add(nil, "NMB (%d) %% MICROBATCH_GROUP (%d) = %d must be 0 or at least PP " ..
                     "(%d): a last group of fewer than PP micro-batches leaves dependency " ..
                     "bubbles, which Megatron refuses (use NMB=%d or NMB=%d)", nmb, N, nmb % N,
                     P, nmb - nmb % N, nmb - nmb % N + N)
        end
    end

    -- Mixed precision and activation recompute (docs/megatron.md §9).
    local rc = recompute_options(opts, errs, most, model)

    -- The rank --inspect asks about.
    if opts.rank ~= nil then
        if not opts.inspect then
            errs.add(nil, "--rank needs --inspect (make inspect RANK=...)")
        elseif math.type(opts.rank) ~= "integer" or opts.rank < 0 or opts.rank >= world then
            errs.add(nil, "RANK (%s) must be between 0 and %d (the world has %d ranks)",
                     tostring(opts.rank), world - 1, world)
        end
    end
    errs.raise()

    if moe and E > 1 and T > 1 and not opts.sp then
        diag.warn(nil, "EP (%d) and TP (%d) are both > 1 without SP: Megatron expects " ..
                  "sequence parallelism here (add SP=1)", E, T)
    end

    local s = {
        tp = T, pp = P, dp = D, cp = C, ep = E, etp = Te, edp = De, vp = V, world = world,
        order = order, first_layers = f, last_layers = l, mbs = mbs, nmb = nmb, seq = seq,
        cp_comm = cp_comm, mb_group = Ng, account_embedding = acc_e, account_loss = acc_l,
        layout = layout, sp = opts.sp == true, dist_opt = opts.dist_opt == true,
        bf16 = opts.bf16 == true, overlap = opts.no_overlap ~= true, bucket = bucket,
        rc = rc,
    }
    local dirname, make = naming(model, s)
    local vocab_mult = model.vocab_pad * T
    return ir.Config {
        model = model, tp = T, pp = P, dp = D, cp = C, ep = E, etp = Te, edp = De, vp = V,
        world = world, order = order, axes = axes, first_layers = f, last_layers = l,
        cp_comm = cp_comm, mb_group = (V > 1 and P > 1) and (Ng or P) or nil,
        account_embedding = acc_e, account_loss = acc_l, layout = layout,
        mbs = mbs, nmb = nmb, seq = seq, sp = s.sp, dist_opt = s.dist_opt, bf16 = s.bf16,
        overlap = s.overlap,
        bucket_size = s.overlap and (bucket or math.max(40000000, 1000000 * D * C)) or nil,
        recompute = rc.granularity, recompute_method = rc.method,
        recompute_layers = rc.layers, recompute_modules = rc.modules,
        vocab_padded = util.round_up(model.vocab, vocab_mult), rank = opts.rank,
        dirname = dirname, outdir = opts.out or ("out/" .. dirname), make = make,
    }
end

-- Model + sizes from the command-line options -> Config.
function M.load(opts)
    return M.configure(M.load_model(opts.model), opts)
end

return M
