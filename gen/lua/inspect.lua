-- inspect.lua: the human-readable reports, as text (at most 100 columns).
-- inspect.rank(cfg, topo, part, sh, r): everything about one rank (--inspect --rank R).
-- inspect.summary(cfg, topo, part, sh): all ranks by stage plus totals (--inspect, report.txt);
-- for worlds above ROWS_MAX ranks one row per stage with its rank ranges.
-- Pure (returns strings); driver.lua prints them, emit.lua writes report.txt.

local partition = require("partition")
local shards = require("shards")
local topology = require("topology")
local util = require("util")

local M = {}

M.ROWS_MAX = 128        -- above this many ranks the summary lists stages, not ranks

local function header(cfg)
    local m = cfg.model
    local lines = {
        string.format("%s (%s): %s", m.name, m.file, m.description or "GPT"),
        string.format("layout    tp%d pp%d dp%d cp%d ep%d etp%d edp%d vp%d: world %d, order %s",
                      cfg.tp, cfg.pp, cfg.dp, cfg.cp, cfg.ep, cfg.etp, cfg.edp, cfg.vp,
                      cfg.world, cfg.order),
        string.format("model     %d layers, hidden %d, %d heads, seq_len %d, vocab %d " ..
                      "(padded to %d), ffn %d", m.layers, m.hidden, m.heads, m.seq_len, m.vocab,
                      cfg.vocab_padded, m.ffn_hidden),
    }
    if m.moe then
        lines[#lines + 1] = string.format("moe       %d experts, top %d, expert ffn %d, %s",
                                          m.moe.experts, m.moe.top_k, m.moe.ffn_hidden,
                                          m.moe.bias and "with biases" or "no biases")
    end
    lines[#lines + 1] = string.format("training  mbs %d, nmb %d, seq %d, sp %s, " ..
                                      "distributed optimizer %s", cfg.mbs, cfg.nmb, cfg.seq,
                                      cfg.sp and "on" or "off", cfg.dist_opt and "on" or "off")
    local uneven = {}
    if cfg.first_layers then uneven[1] = string.format("first stage %d", cfg.first_layers) end
    if cfg.last_layers then uneven[#uneven + 1] = string.format("last stage %d", cfg.last_layers) end
    if #uneven > 0 then
        lines[#lines + 1] = "uneven    layers on the " .. table.concat(uneven, ", ")
    end
    return lines
end

local function chunks_text(stage)
    local parts = {}
    for _, c in ipairs(stage.chunks) do
        parts[#parts + 1] = (#stage.chunks > 1 and (c.vp .. ":") or "") .. partition.range_text(c)
    end
    return table.concat(parts, " ")
end

local function duties(stage, P)
    local d = {}
    for _, c in ipairs(stage.chunks) do
        if c.embedding then d[#d + 1] = "embedding" end
        if c.head then d[#d + 1] = (P > 1) and "head+loss (tied wte)" or "head+loss" end
    end
    return #d > 0 and table.concat(d, ", ") or "-"
end

-- One class of each stage (the classes of a stage hold equal amounts: every TP rank has the
-- same local shapes, padding included, and every EP rank as many experts).
local function stage_class(sh)
    local first = {}
    for _, c in ipairs(sh.classes) do
        if not first[c.pp] then first[c.pp] = c end
    end
    return first
end

-- Memory of each stage's ranks for every dtype, with or without the distributed optimizer.
local function memory_table(cfg, sh, dist_opt)
    local rows = { { "stage" } }
    for _, d in ipairs(sh.dtypes) do rows[1][#rows[1] + 1] = d.label end
    local first = stage_class(sh)
    for p = 0, cfg.pp - 1 do
        local row = { tostring(p) }
        for _, d in ipairs(sh.dtypes) do
            row[#row + 1] = util.bytes(shards.bytes_of(first[p], d.name, dist_opt).total)
        end
        rows[#rows + 1] = row
    end
    return util.columns(rows, "rrrr")
end

function M.summary(cfg, topo, part, sh)
    local out = header(cfg)
    out[#out + 1] = string.format("params    %s unique (%s in experts); %s held over all ranks",
                                  util.thousands(sh.unique), util.thousands(sh.unique_expert),
                                  util.thousands(sh.held))
    out[#out + 1] = ""
    local P = cfg.pp
    local pp_kind = topology.kind(topo, "pp")
    local function stage_ranks(p)
        local ranks = {}
        for g = 0, pp_kind.count - 1 do ranks[#ranks + 1] = pp_kind.members[g * P + p + 1] end
        table.sort(ranks)
        return ranks
    end
    if cfg.world <= M.ROWS_MAX then
        out[#out + 1] = "ranks by stage"
        local rows = { { "rank", "pp", "tp", "cp", "dp", "etp", "ep", "edp", "layers", "duties",
                         "params/rank" } }
        for p = 0, P - 1 do
            local st = part.stages[p + 1]
            for _, r in ipairs(stage_ranks(p)) do
                local c = topology.coords(topo, r)
                rows[#rows + 1] = { tostring(r), tostring(p), tostring(c.tp), tostring(c.cp),
                                    tostring(c.dp), tostring(c.etp), tostring(c.ep),
                                    tostring(c.edp), chunks_text(st), duties(st, P),
                                    util.thousands(shards.class_of(sh, r).numel) }
            end
        end
        for _, line in ipairs(util.columns(rows, "rrrrrrrrllr")) do out[#out + 1] = line end
    else
        out[#out + 1] = "stages"
        local rows = { { "stage", "ranks", "layers", "duties", "params/rank" } }
        local first = stage_class(sh)
        for p = 0, P - 1 do
            local st, ranks = part.stages[p + 1], stage_ranks(p)
            rows[#rows + 1] = { tostring(p), util.ranks(ranks, 1, #ranks, 36) ..
                                string.format(" (%d)", #ranks), chunks_text(st), duties(st, P),
                                util.thousands(first[p].numel) }
        end
        for _, line in ipairs(util.columns(rows, "rlllr")) do out[#out + 1] = line end
    end
    for _, dist in ipairs({ false, true }) do
        out[#out + 1] = ""
        if dist then
            local experts = cfg.model.moe and
                            string.format("; experts over expt-dp = %d", cfg.edp) or ""
            out[#out + 1] = string.format("memory per rank, distributed optimizer (state " ..
                                          "sharded over dp-cp = %d%s)", cfg.dp * cfg.cp, experts)
        else
            out[#out + 1] = "memory per rank: params + grads + optimizer state, no distributed " ..
                            "optimizer"
        end
        for _, line in ipairs(memory_table(cfg, sh, dist)) do out[#out + 1] = line end
    end
    out[#out + 1] = ""
    return table.concat(out, "\n")
end

-- -- One rank --------------------------------------------------------------------------------

local function slice_text(piece, shape)
    local dims = {}
    for d = 1, #shape do
        if piece.start[d] == 0 and piece.size[d] == shape[d] then
            dims[d] = ":"
        else
            dims[d] = string.format("%d:%d", piece.start[d], piece.start[d] + piece.size[d])
        end
    end
    return "[" .. table.concat(dims, ", ") .. "]"
end

-- What a param's pieces cover, as slice texts: "all", "padding only", or "[a:b, :]"...
local function holds(p)
    if #p.pieces == 0 then return { "padding only" } end
    local whole = #p.pieces == 1
    for d = 1, #p.shape do
        whole = whole and p.pieces[1].start[d] == 0 and p.pieces[1].size[d] == p.shape[d]
    end
    if whole then return { "all" } end
    local out = {}
    for i, piece in ipairs(p.pieces) do out[i] = slice_text(piece, p.shape) end
    return out
end

function M.rank(cfg, topo, part, sh, r)
    local out = header(cfg)
    local c = topology.coords(topo, r)
    local P = cfg.pp
    out[#out + 1] = ""
    out[#out + 1] = string.format("rank %d of %d", r, cfg.world)
    out[#out + 1] = string.format("  attention grid  tp %d  cp %d  dp %d  pp %d",
                                  c.tp, c.cp, c.dp, c.pp)
    out[#out + 1] = string.format("  expert grid     etp %d  ep %d  edp %d  pp %d",
                                  c.etp, c.ep, c.edp, c.pp)
    local prev, nxt = topology.neighbours(topo, r)
    out[#out + 1] = string.format("  pipeline        stage %d of %d; prev rank %d, next rank %d%s",
                                  c.pp, P, prev, nxt, P > 1 and " (wrapping)" or "")
    local st = part.stages[c.pp + 1]
    for _, ch in ipairs(st.chunks) do
        local duty = {}
        if ch.embedding then duty[#duty + 1] = "embedding (wte, wpe)" end
        if ch.head then
            duty[#duty + 1] = (P > 1) and "ln_f, LM head (tied wte copy), loss"
                              or "ln_f, LM head (wte), loss"
        end
        out[#out + 1] = string.format("  chunk %d         layers %s (%d)%s", ch.vp,
                                      partition.range_text(ch), ch.count,
                                      #duty > 0 and ("; " .. table.concat(duty, "; ")) or "")
    end

    out[#out + 1] = ""
    out[#out + 1] = "groups"
    local rows = { { "kind", "size", "group", "index", "members" } }
    for _, kind in ipairs(topo.kinds) do
        local g, pos = topology.group_of(topo, kind.name, r)
        if g then
            local base = g * kind.size
            rows[#rows + 1] = { kind.name, tostring(kind.size), tostring(g), tostring(pos),
                                util.ranks(kind.members, base + 1, base + kind.size, 60) }
        else
            rows[#rows + 1] = { kind.name, "-", "-", "-", "not a member (" ..
                                (kind.name == "embd" and "not the first or last stage"
                                 or "not the first stage") .. ")" }
        end
    end
    for _, line in ipairs(util.columns(rows, "lrrrl")) do out[#out + 1] = "  " .. line end

    local cls = shards.class_of(sh, r)
    out[#out + 1] = ""
    out[#out + 1] = string.format("parameters: %d tensors, %s elements on this rank",
                                  #cls.params, util.thousands(cls.numel))
    out[#out + 1] = "  (tp: split = TP-sharded; copy = replica counted in the grad norm; " ..
                    "dup = replica left out)"
    rows = { { "name", "global", "local", "tp", "reduce" } }
    local held = {}
    for _, p in ipairs(cls.params) do
        rows[#rows + 1] = { p.name .. (p.tied and " (tied)" or ""), util.shape(p.shape),
                            util.shape(p.local_shape),
                            p.tp_sharded and "split" or (p.tp_duplicate and "dup" or "copy"),
                            table.concat(p.reduce, ",") }
        held[#rows] = holds(p)
    end
    -- "holds" is the last column, its pieces wrapping within 100 columns; when the other
    -- columns leave too little room, the pieces go on lines of their own below each row.
    local lines = util.columns(rows, "lrrll")
    local used = 0
    for _, line in ipairs(lines) do used = math.max(used, #line + 4) end
    local below = 100 - used < 24
    local col = below and 10 or used
    for i, line in ipairs(lines) do
        local packed, cur = {}, nil
        for _, h in ipairs(held[i] or {}) do
            if cur and #cur + 1 + #h <= 100 - col then
                cur = cur .. " " .. h
            else
                if cur then packed[#packed + 1] = cur end
                cur = h
            end
        end
        packed[#packed + 1] = cur
        local row = "  " .. line
        if i == 1 then
            out[#out + 1] = below and row or (row .. string.rep(" ", col - #row) .. "holds")
        elseif below then
            out[#out + 1] = row
            for k, text in ipairs(packed) do
                out[#out + 1] = (k == 1 and "    holds " or string.rep(" ", col)) .. text
            end
        else
            out[#out + 1] = row .. string.rep(" ", col - #row) .. (packed[1] or "")
            for k = 2, #packed do out[#out + 1] = string.rep(" ", col) .. packed[k] end
        end
    end

    out[#out + 1] = ""
    out[#out + 1] = "memory on this rank"
    rows = { { "", "params", "grads", "optimizer", "total" } }
    for _, dist in ipairs({ false, true }) do
        rows[#rows + 1] = { dist and "distributed optimizer:" or "no distributed optimizer:",
                            "", "", "", "" }
        for _, d in ipairs(sh.dtypes) do
            local b = shards.bytes_of(cls, d.name, dist)
            rows[#rows + 1] = { "  " .. d.label, util.bytes(b.params), util.bytes(b.grads),
                                util.bytes(b.optim), util.bytes(b.total) }
        end
    end
    for _, line in ipairs(util.columns(rows, "lrrrr")) do out[#out + 1] = "  " .. line end
    out[#out + 1] = ""
    return table.concat(out, "\n")
end

return M
