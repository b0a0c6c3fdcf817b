-- ccode.lua: the C text of layer.lua's statements -- kernel calls, collectives, p2p messages,
-- loops -- as lines of at most 100 columns, for emit.lua to hand to the stage template.
-- Printing only: what is called, with which arguments and in which order was decided by
-- layer.lua and program.lua; this module spells their records in C (docs/PROGRAM.md §2).

local util = require("util")

local M = {}

local WIDTH = 100

-- Group kind -> the generated code's handle.
local GROUP = { tp = "TP", ["dp-cp"] = "DPCP", pp = "PP", embd = "EMBD", mp = "MP", ep = "EP",
                ["expt-tp"] = "ETP", ["expt-dp"] = "EDP", ["tp-ep-pp"] = "TPEPPP", cp = "CP",
                ["tp-cp"] = "TPCP" }

function M.group(kind)
    if kind == "world" then return "rt_group_world()" end
    return "GROUP(" .. assert(GROUP[kind], "ccode: no group " .. kind) .. ")"
end

-- An Expr: "CFG_N_SP * CFG_C", "2 * CFG_C_LOCAL", "CFG_CP - 1", "(i % 2) * CFG_N * ...".
function M.expr(e)
    local out = {}
    for i, t in ipairs(e.terms) do
        local parts = {}
        local c = t.c
        local neg = c < 0
        if neg then c = -c end
        if c ~= 1 or #t.f == 0 then parts[#parts + 1] = tostring(c) end
        for _, f in ipairs(t.f) do
            parts[#parts + 1] = f:match("^[%u_][%u%d_]*$") and ("CFG_" .. f) or f
        end
        local text = table.concat(parts, " * ")
        if i == 1 then out[1] = (neg and "-" or "") .. text
        else out[#out + 1] = (neg and " - " or " + ") .. text end
    end
    return table.concat(out)
end

-- The element type of a memory-plan entry: A (the activations' dtype), F (f32), I (i32).
local function mem_dtype(mems, id)
    local m = assert(mems[id], "ccode: no memory plan entry " .. id)
    return m.dtype
end

local function per_layer(id) return id:match("^L_") or id:match("^ML_") end

-- An Arg as C.
function M.arg(a, mems)
    local k = a.kind
    if k == "mem" then
        local base = (per_layer(a.id) and "LAYER(" or "STAGE(") .. a.id .. ")"
        if not a.off then return base end
        local dt = mem_dtype(mems, a.id)
        if dt == "A" then return "AT(" .. base .. ", " .. M.expr(a.off) .. ")" end
        return "(" .. (dt == "F" and "(float *)" or "(int *)") .. base .. " + " ..
               M.expr(a.off) .. ")"
    elseif k == "param" then return "TENSOR(" .. a.id .. ")"
    elseif k == "grad" then return "GRAD(" .. a.id .. ")"
    elseif k == "int" then return M.expr(a.expr)
    elseif k == "dtype" then
        return a.id == "ACT" and "CFG_ACT" or ("RT_" .. a.id)
    elseif k == "ident" and a.off then      -- x, out, dy: activations
        return "AT(" .. a.id .. ", " .. M.expr(a.off) .. ")"
    end
    return a.id                             -- float (a CFG_ name), lit, ident
end

-- The dtype argument of a collective moving arg 'a' (as the buffer is typed).
local function coll_dtype(c, mems)
    local a = c.send
    if a.kind == "mem" then
        local dt = mem_dtype(mems, a.id)
        if dt == "A" then return "CFG_ACT" end
        return dt == "F" and "RT_F32" or "RT_I32"
    end
    if a.kind == "ident" then return "CFG_ACT" end       -- x, dres, dy: activations
    return c.dtype == "i32" and "RT_I32" or c.dtype == "f32" and "RT_F32" or "CFG_ACT"
end

-- "fn(a, b, c);" with 'indent' spaces, wrapped after commas, continuation lines aligned
-- after the parenthesis. open, close: other brackets ("{ ", " },": an initializer).
function M.call(fn, args, indent, prefix, suffix, open, close)
    local pad = string.rep(" ", indent)
    local head = pad .. (prefix or "") .. fn .. (open or "(")
    local tail = (close or ")") .. (suffix or ";")
    local one = head .. table.concat(args, ", ") .. tail
    if #one <= WIDTH then return { one } end
    local lines, cur = {}, head
    local cont = string.rep(" ", #head)
    for i, a in ipairs(args) do
        local piece = a .. (i < #args and "," or tail)
        if cur ~= head and cur ~= cont and #cur + 1 + #piece > WIDTH then
            lines[#lines + 1] = cur
            cur = cont .. piece
        else
            cur = cur .. ((cur == head or cur == cont) and "" or " ") .. piece
        end
    end
    lines[#lines + 1] = cur
    return lines
end

-- A comment of several lines at 'indent' ("/* ...", "** ...", "... */").
function M.comment(text, indent)
    local pad = string.rep(" ", indent)
    local words = {}
    for w in text:gmatch("%S+") do words[#words + 1] = w end
    local lines = util.wrap(words, WIDTH - indent - 6)
    if #lines == 1 then return { pad .. "/* " .. lines[1] .. " */" } end
    for i, l in ipairs(lines) do
        lines[i] = pad .. (i == 1 and "/* " or "** ") .. l .. (i == #lines and " */" or "")
    end
    return lines
end

local function add(out, lines)
    for _, l in ipairs(lines) do out[#out + 1] = l end
end

local RED = { sum = "RT_SUM", max = "RT_MAX" }

-- The lines of one collective statement.
local function coll_lines(st, indent, mems)
    local c = st.coll
    local A = function(a) return M.arg(a, mems) end
    local dt, g = coll_dtype(c, mems), M.group(c.group)
    local out = {}
    if st.text then add(out, M.comment(st.text, indent)) end
    if c.op == "allgather" or c.op == "reduce_scatter" or c.op == "alltoall" then
        add(out, M.call("rt_" .. c.op, { A(c.send), A(c.recv), M.expr(c.n_expr), dt, g }, indent))
    elseif c.op == "allreduce" then
        add(out, M.call("rt_allreduce", { A(c.send), M.expr(c.n_expr), dt, RED[c.red], g },
                        indent))
    elseif c.op == "alltoallv" then
        add(out, M.call("gpt_moe_a2a", { "m", "GPT_A2A_" .. c.a2a }, indent, "e = "))
        add(out, M.call("rt_alltoallv", { A(c.send), "e->scounts", "e->sdispls", A(c.recv),
                                          "e->rcounts", "e->rdispls", dt, g }, indent))
    else
        error("ccode: no collective " .. c.op)
    end
    return out
end

local PEER = { CP_NEXT = "gpt_peer(GPT_CP_NEXT)", CP_PREV = "gpt_peer(GPT_CP_PREV)",
               PP_NEXT = "gpt_peer(GPT_PP_NEXT)", PP_PREV = "gpt_peer(GPT_PP_PREV)" }

local function p2p_lines(st, indent, mems)
    local pad = string.rep(" ", indent)
    local out = { pad .. "{" }
    add(out, M.comment(st.text, indent + 4))
    out[#out + 1] = pad .. "    rt_p2p_op ops[] = {"
    for _, m in ipairs(st.msgs) do
        local dt = mem_dtype(mems, m.buf.id) == "A" and "CFG_ACT" or "RT_F32"
        add(out, M.call("", { m.send and "1" or "0", M.arg(m.buf, mems), M.expr(m.n), dt,
                              PEER[m.peer], "GPT_TAG_" .. m.tag }, indent + 8, nil, "", "{ ",
                        " },"))
    end
    out[#out + 1] = pad .. "    };"
    out[#out + 1] = string.format("%s    %s(ops, %d);", pad, st.start and "hop = rt_p2p_start" or
                                  "rt_p2p", #st.msgs)
    out[#out + 1] = pad .. "}"
    return out
end

-- The lines of a statement list at 'indent'.
function M.stmts(stmts, indent, mems)
    local out = {}
    local pad = string.rep(" ", indent)
    for _, st in ipairs(stmts) do
        if st.kind == "K" then
            local args = {}
            for i, a in ipairs(st.args) do args[i] = M.arg(a, mems) end
            add(out, M.call(st.fn, args, indent))
        elseif st.kind == "C" then
            add(out, coll_lines(st, indent, mems))
        elseif st.kind == "P" then
            add(out, p2p_lines(st, indent, mems))
        elseif st.kind == "W" then
            out[#out + 1] = pad .. "rt_wait(hop);"
        elseif st.kind == "S" then
            -- a call of the stage's helper that starts the collective, commented on its line
            local args = {}
            for i, a in ipairs(st.args) do args[i] = M.arg(a, mems) end
            local lines = M.call(st.fn, args, indent)
            if #lines == 1 and #lines[1] + #st.text + 9 <= WIDTH then
                lines[1] = lines[1] .. "   /* " .. st.text .. " */"
            else
                add(out, M.comment(st.text, indent))
            end
            add(out, lines)
        elseif st.kind == "WAIT" and st.nreq > 1 then
            out[#out + 1] = string.format("%sfor (int k = %d; k < %d; k++) wait_req(k);", pad,
                                          st.req, st.req + st.nreq)
        elseif st.kind == "WAIT" then
            out[#out + 1] = string.format("%swait_req(%d);", pad, st.req)
        elseif st.kind == "NOTE" then
            add(out, M.comment(st.text, indent))
        elseif st.kind == "LOOP" then
            if st.text then add(out, M.comment(st.text, indent)) end
            out[#out + 1] = string.format("%sfor (int %s = 0; %s < %s; %s++) {", pad, st.var,
                                          st.var, M.expr(st.count), st.var)
            add(out, M.stmts(st.body, indent + 4, mems))
            out[#out + 1] = pad .. "}"
        else
            error("ccode: no statement kind " .. st.kind)
        end
    end
    return out
end

-- Which of a function's local names its statements use (a, w, dw, x, m, e, ...).
local function uses(stmts, set)
    set = set or {}
    local function arg(a)
        if a.kind == "mem" then set[per_layer(a.id) and "a" or "S"] = true
        elseif a.kind == "param" then set.w = true
        elseif a.kind == "grad" then set.dw = true
        elseif a.kind == "ident" then set[a.id] = true end
    end
    for _, st in ipairs(stmts) do
        for _, a in ipairs(st.args or {}) do arg(a) end
        if st.coll then
            if st.coll.send then arg(st.coll.send) end
            if st.coll.recv then arg(st.coll.recv) end
            if st.coll.a2a then set.e = true; set.m = true end
        end
        for _, m in ipairs(st.msgs or {}) do arg(m.buf) end
        if st.kind == "P" and st.start then set.hop = true end
        if st.body then uses(st.body, set) end
    end
    return set
end
M.uses = uses

-- Each function's parameters and the locals it may declare (in this order), with comments.
local PROTO = {
    embedding_fwd = { "int c, int mb, int slot", {
        { "out", "void *out = gpt_x(c, slot);", "the chunk's input (N_SP, C)" },
        { "tok", "int *tok = gpt_tokens(c, slot);", "(N) token ids" },
        { "w", "void *const *w = gpt_params(c, -1);", "the embedding's tensors" } } },
    embedding_bwd = { "int c, int slot", {
        { "dy", "const void *dy = gpt_dy(c, slot);", "d(the chunk's input) (N_SP, C)" },
        { "tok", "const int *tok = gpt_tokens(c, slot);", "(N) token ids" },
        { "dw", "float *const *dw = gpt_grads(c, -1);", "the embedding's f32 gradients" } } },
    layer_fwd = { "int c, int slot, int j, int again", {
        { "a", "void *const *a = gpt_acts(c, slot, j);", "its activations (memory plan)" },
        { "w", "void *const *w = gpt_params(c, j);", "its tensors" },
        { "x", "const void *x = gpt_layer_in(c, slot, j);",
          "the chunk's input or layer j-1's output" },
        { "m", "gpt_moe *m = gpt_moe_of(c, slot, j);", "its routing state" },
        { "e", "const gpt_a2a *e;", "the counts of an all-to-all" },
        { "hop", "rt_req *hop;", "the ring's hop in flight" } } },
    layer_bwd = { "int c, int slot, int j", {
        { "a", "void *const *a = gpt_acts(c, slot, j);", "its activations (memory plan)" },
        { "w", "void *const *w = gpt_params(c, j);", "its tensors" },
        { "dw", "float *const *dw = gpt_grads(c, j);", "their f32 gradients" },
        { "x", "const void *x = gpt_layer_in(c, slot, j);", "its input" },
        { "dres", "void *dres = gpt_dy(c, slot);", "d(its output) in, d(its input) out" },
        { "m", "gpt_moe *m = gpt_moe_of(c, slot, j);", "its routing state" },
        { "e", "const gpt_a2a *e;", "the counts of an all-to-all" },
        { "hop", "rt_req *hop;", "the ring's hop in flight" } } },
    head_fwd_bwd = { "int c, int mb, int slot", {
        { "x", "const void *x = gpt_out(c, slot);", "the chunk's output (N_SP, C)" },
        { "dy", "void *dy = gpt_dy(c, slot);", "its gradient" },
        { "w", "void *const *w = gpt_params(c, -1);", "the head's tensors" },
        { "dw", "float *const *dw = gpt_grads(c, -1);", "their f32 gradients" },
        { "loss", "float *loss = (float *)STAGE(X_LOSS) + mb;", "the micro-batch's loss sum" } } },
}

-- The lines of one model piece's function: "static void name(...)", its locals, its body.
function M.function_lines(code, mems, title)
    local proto = assert(PROTO[code.name], "ccode: no prototype for " .. code.name)
    local out = {}
    if title then add(out, M.comment(title, 0)) end
    out[#out + 1] = string.format("static void %s(%s)", code.name, proto[1])
    out[#out + 1] = "{"
    local used = uses(code.stmts)
    local decls = {}
    for _, d in ipairs(proto[2]) do
        if used[d[1]] then
            local line = "    " .. d[2]
            local full = line .. string.rep(" ", math.max(1, 48 - #line)) .. "/* " .. d[3] .. " */"
            decls[#decls + 1] = #full <= WIDTH and full or line
        end
    end
    local body = M.stmts(code.stmts, 4, mems)
    -- parameters that nothing reads: said so (C's -Wunused-parameter)
    local text = table.concat(decls, "\n") .. "\n" .. table.concat(body, "\n")
    add(out, decls)
    for p in proto[1]:gmatch("int (%w+)") do
        if not text:find("%f[%w_]" .. p .. "%f[^%w_]") then
            out[#out + 1] = "    (void)" .. p .. ";"
        end
    end
    add(out, body)
    out[#out + 1] = "}"
    return out
end

return M
