-- partition.lua: which layers each pipeline stage and virtual chunk builds
-- (docs/megatron.md §2: get_num_layers_to_build / get_transformer_layer_offset).
-- partition.build(cfg, topo) -> Partition. Even split, uneven first/last stage, and interleaved
-- chunks; the embedding sits on (stage 0, chunk 0), ln_f + head + loss on (last stage, last
-- chunk). Sizes were validated by config.lua; here a violated rule is a generator bug. Pure.

local ir = require("ir")

local M = {}

-- Layers of every (stage, chunk): result[p+1][v+1] = {first = 0-based layer, count = n}.
-- f / l: layers on the first / last stage (nil = even split). acc_embedding / acc_loss:
-- Megatron's account_for_{embedding,loss}_in_pipeline_split (a pseudo-layer slot each; only
-- with the even split). Not reachable from the command line; the 2(a) examples test them.
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

function M.build(cfg, topo)
    local P, V = cfg.pp, cfg.vp
    assert(topo.sizes.pp == P)
    local split = M.split(cfg.model.layers, P, V, cfg.first_layers, cfg.last_layers)
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
