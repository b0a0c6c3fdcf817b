-- partition.lua: which layers each pipeline stage and virtual chunk builds
-- (docs/megatron.md §2: get_num_layers_to_build / get_transformer_layer_offset).
-- partition.build(cfg, topo) -> Partition. Even split (optionally counting the embedding and
-- the loss as layers), uneven first/last stage, a custom layout string, and interleaved
-- chunks; the embedding sits on (stage 0, chunk 0), ln_f + head + loss on (last stage, last
-- chunk). A chunk may hold no layer (a layout's "E|t*4|t*4|L"): it passes its input on.
-- Sizes were validated by config.lua; here a violated rule is a generator bug. Pure.

local ir = require("ir")

local M = {}

-- Layers of every (stage, chunk): result[p+1][v+1] = {first = 0-based layer, count = n}.
-- f / l: layers on the first / last stage (nil = even split). acc_embedding / acc_loss:
-- Megatron's account_for_{embedding,loss}_in_pipeline_split (a pseudo-layer slot each; only
-- with the even split): --account-embedding, --account-loss.
function M.split(L, P, V, f, l, acc_embedding, acc_loss)
    local out = {}
    if f or l then
        assert(not (acc_embedding or acc_loss), "accounting flags need the even split")
        local Pm = P - (f and 1 or 0) - (l and 1 or 0)
        local Lm = L - (f or 0) - (l or 0)
        assert(Lm >= 0 and (Pm == 0 and Lm == 0 or Pm > 0 and Lm % Pm == 0), "uneven split")
        local mid = Pm > 0 and Lm // Pm or 0
        local fv, lv, midv = (f or 0) // V, (l or 0) // V, mid // V
        local tot = fv + (Lm // V) + lv
        for p = 0, P - 1 do
            local n = (p == 0 and f) or (p == P - 1 and l) or mid
            assert(n % V == 0 and n > 0, "uneven split: chunk sizes")
            local chunks = {}
            for v = 0, V - 1 do
                local first
                if p == 0 then
                    first = v * tot
                else
                    first = v * tot + fv + (p - (f and 1 or 0)) * midv
                end
                chunks[v + 1] = { first = first, count = n // V }
            end
            out[p + 1] = chunks
        end
        return out
    end
    local Lx = L + (acc_embedding and 1 or 0) + (acc_loss and 1 or 0)
    assert(Lx % P == 0 and (Lx // P) % V == 0, "even split")
    local k = Lx // P // V
    for p = 0, P - 1 do
        local chunks = {}
        for v = 0, V - 1 do
            local first, count = v * (Lx // V) + p * k, k
            if acc_embedding then
                if p == 0 and v == 0 then count = count - 1 else first = first - 1 end
            end
            if acc_loss and p == P - 1 and v == V - 1 then count = count - 1 end
            chunks[v + 1] = { first = first, count = count }
        end
        out[p + 1] = chunks
    end
    return out
end

-- -- Custom layouts (Megatron's --pipeline-model-parallel-layout) ----------------------------

M.LAYOUT_MAX = 1 << 20          -- most characters a layout may expand to

-- What each layout character places (Megatron's char2layer_type). ORDER LAYOUT_CHARS.
M.LAYOUT_CHARS = { E = "embedding", t = "transformer layer", m = "MTP layer", L = "loss" }

--[[
** Parse a layout string with Megatron's grammar (PipelineParallelLayerLayout.parse_str_to_list):
** commas are cosmetic and dropped; "(body)*n" repeats body n times (body: no ')'), then "x*n"
** repeats the character before '*'; '|' separates virtual stages; every character left is
** one of E, t, m, L. Returns the list of virtual stages in string order, each
** { E = n, t = n, m = n, L = n, text = "Et*2" }, or nil and a message (no location).
]]
function M.parse_layout(str)
    local s, long = str:gsub(",", ""), false
    local function rep(body, n)
        n = tonumber(n)
        if not n or #body * n > M.LAYOUT_MAX then
            long = true
            return ""
        end
        return body:rep(n)
    end
    s = s:gsub("%(([^)]+)%)%*(%d+)", rep)
    s = s:gsub("(.)%*(%d+)", rep)
    if long or #s > M.LAYOUT_MAX then
        return nil, ("expands to more than %d characters"):format(M.LAYOUT_MAX)
    end
    local stages = {}
    for part in (s .. "|"):gmatch("([^|]*)|") do
        local st = { E = 0, t = 0, m = 0, L = 0 }
        for ch in part:gmatch(".") do
            if not M.LAYOUT_CHARS[ch] then
                return nil, ("has an unknown layer character '%s' in virtual stage %d ('%s'; " ..
                    "known: E embedding, t transformer layer, m MTP layer, L loss, with | " ..
                    "between stages, (..)*n and x*n for repeats)"):format(ch, #stages, part)
            end
            st[ch] = st[ch] + 1
        end
        st.text = part
        stages[#stages + 1] = st
    end
    return stages
end

-- Short text of a parsed virtual stage: "E t2", "t4", "t1 L", "empty".
function M.stage_text(st)
    local w = {}
    if st.E > 0 then w[#w + 1] = "E" end
    if st.t > 0 then w[#w + 1] = "t" .. st.t end
    if st.m > 0 then w[#w + 1] = "m" .. st.m end
    if st.L > 0 then w[#w + 1] = "L" end
    return #w > 0 and table.concat(w, " ") or "empty"
end

-- Layers of every (stage, chunk) from a parsed layout (validated): virtual stage s is chunk
-- s // P of stage s % P, and the transformer layers are numbered in string order. Same shape
-- as M.split.
function M.layout_split(stages, P)
    local out, first = {}, 0
    for p = 1, P do out[p] = {} end
    for s, st in ipairs(stages) do
        local p, v = (s - 1) % P, (s - 1) // P
        out[p + 1][v + 1] = { first = first, count = st.t }
        first = first + st.t
    end
    return out
end

function M.build(cfg, topo)
    local P, V = cfg.pp, cfg.vp
    assert(topo.sizes.pp == P)
    local split
    if cfg.layout then
        local stages = assert(M.parse_layout(cfg.layout))
        assert(#stages == P * V, "layout: stages")
        split = M.layout_split(stages, P)
    else
        split = M.split(cfg.model.layers, P, V, cfg.first_layers, cfg.last_layers,
                        cfg.account_embedding, cfg.account_loss)
    end
    local stages = {}
    for p = 0, P - 1 do
        local chunks, total = {}, 0
        for v = 0, V - 1 do
            local c = split[p + 1][v + 1]
            chunks[v + 1] = ir.Chunk { vp = v, first = c.first, count = c.count,
                                       embedding = (p == 0 and v == 0),
                                       head = (p == P - 1 and v == V - 1) }
            total = total + c.count
        end
        stages[p + 1] = ir.Stage { stage = p, count = total, chunks = chunks }
    end
    return ir.Partition { layers = cfg.model.layers, pp = P, vp = V, stages = stages }
end

-- Stage and chunk (0-based) that build global layer 'layer', or nil.
function M.locate(part, layer)
    for _, st in ipairs(part.stages) do
        for _, c in ipairs(st.chunks) do
            if layer >= c.first and layer < c.first + c.count then return st.stage, c.vp end
        end
    end
end

-- "0-11" / "3" / "-" for a chunk's layers.
function M.range_text(c)
    if c.count == 0 then return "-" end
    if c.count == 1 then return string.format("%d", c.first) end
    return string.format("%d-%d", c.first, c.first + c.count - 1)
end

return M
