-- tests/lua/partition_test.lua: layer placement (docs/megatron.md §2), layer for layer:
-- the worked examples of §2 (even, interleaved, uneven), embedding/head duties, and
-- over random valid layouts: every layer placed exactly once, chunks in Megatron's order.
-- Run: build/gen --lua tests/lua/partition_test.lua

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
require("strict")
local T = require("harness")("partition")
local F = require("fixtures")
local diag = require("diag")
local partition = require("partition")

-- {{"0..1", "8..9"}, ...}: the layers of every (stage, chunk) as "a..b" ("a" for one layer).
local function table_of(split)
    local out = {}
    for p, chunks in ipairs(split) do
        out[p] = {}
        for v, c in ipairs(chunks) do
            out[p][v] = c.count == 1 and tostring(c.first)
                        or string.format("%d..%d", c.first, c.first + c.count - 1)
        end
    end
    return out
end

T.test("2(a) L=16 P=4 V=2 even", function()
    T.eq(table_of(partition.split(16, 4, 2)),
         { { "0..1", "8..9" }, { "2..3", "10..11" }, { "4..5", "12..13" }, { "6..7", "14..15" } },
         "layers")
end)

T.test("2(b) L=30 P=4 f=6 l=8", function()
    T.eq(table_of(partition.split(30, 4, 1, 6, 8)),
         { { "0..5" }, { "6..13" }, { "14..21" }, { "22..29" } }, "layers")
end)

T.test("2(b) L=30 P=4 V=2 f=6 l=8", function()
    T.eq(table_of(partition.split(30, 4, 2, 6, 8)),
         { { "0..2", "15..17" }, { "3..6", "18..21" }, { "7..10", "22..25" },
           { "11..14", "26..29" } }, "layers")
end)

T.test("2(a) L=14 P=4 embedding and loss accounted", function()
    T.eq(table_of(partition.split(14, 4, 1, nil, nil, true, true)),
         { { "0..2" }, { "3..6" }, { "7..10" }, { "11..13" } }, "layers")
end)

T.test("2(a) L=14 P=4 V=2 embedding and loss accounted", function()
    T.eq(table_of(partition.split(14, 4, 2, nil, nil, true, true)),
         { { "0", "7..8" }, { "1..2", "9..10" }, { "3..4", "11..12" }, { "5..6", "13" } },
         "layers")
end)

T.test("8 layers, 2 stages, 2 chunks; and 4 chunks", function()
    T.eq(table_of(partition.split(8, 2, 2)), { { "0..1", "4..5" }, { "2..3", "6..7" } }, "V=2")
    T.eq(table_of(partition.split(8, 2, 4)), { { "0", "2", "4", "6" }, { "1", "3", "5", "7" } },
         "V=4")
end)

T.test("only first or only last given", function()
    T.eq(table_of(partition.split(12, 4, 1, 6)),
         { { "0..5" }, { "6..7" }, { "8..9" }, { "10..11" } }, "first only")
    T.eq(table_of(partition.split(12, 4, 1, nil, 3)),
         { { "0..2" }, { "3..5" }, { "6..8" }, { "9..11" } }, "last only")
    T.eq(table_of(partition.split(10, 2, 1, 3, 7)), { { "0..2" }, { "3..9" } },
         "two stages, both given")
end)

T.test("embedding on stage 0 chunk 0, head on the last stage's last chunk", function()
    local _, _, part = F.build({ layers = 16 }, { pp = 4, vp = 2, nmb = 4 })
    for _, st in ipairs(part.stages) do
        for _, c in ipairs(st.chunks) do
            T.eq(c.embedding, st.stage == 0 and c.vp == 0, "embedding flag")
            T.eq(c.head, st.stage == 3 and c.vp == 1, "head flag")
        end
    end
    T.eq({ partition.locate(part, 0) }, { 0, 0 }, "layer 0")
    T.eq({ partition.locate(part, 10) }, { 1, 1 }, "layer 10")
    T.eq({ partition.locate(part, 15) }, { 3, 1 }, "layer 15")
    local _, _, one = F.build({ layers = 4 }, {})
    T.ok(one.stages[1].chunks[1].embedding and one.stages[1].chunks[1].head,
         "one stage: embedding and head together")
end)

-- Every layer exactly once, and chunks ordered as Megatron's virtual stages: walking
-- (chunk, stage) in order covers 0..L-1 contiguously.
local function check(L, P, V, split)
    local next_layer = 0
    for v = 1, V do
        for p = 1, P do
            local c = split[p][v]
            T.ok(c.count >= 1, "empty chunk (stage %d chunk %d)", p - 1, v - 1)
            T.eq(c.first, next_layer,
                 string.format("first layer of stage %d chunk %d", p - 1, v - 1))
            next_layer = c.first + c.count
        end
    end
    T.eq(next_layer, L, "layers placed")
end

T.test("random layouts: every layer placed once, in virtual-stage order", function()
    local rnd = T.random(3)
    local accepted = 0
    for trial = 1, 600 do
        local P, V = rnd(1, 8), rnd(1, 4)
        if P == 1 then V = 1 end
        local opts = { pp = P, vp = V, nmb = P }
        local L
        if trial % 3 == 0 then          -- anything: the validator decides
            L = rnd(1, 64)
            if P > 1 and rnd(0, 2) == 0 then opts.first_layers = rnd(1, 12) end
            if P > 1 and rnd(0, 2) == 0 then opts.last_layers = rnd(1, 12) end
        else                            -- built to be valid
            local f = (P > 1 and rnd(0, 1) == 1) and V * rnd(1, 4) or nil
            local l = (P > 1 and rnd(0, 1) == 1) and V * rnd(1, 4) or nil
            local middle = P - (f and 1 or 0) - (l and 1 or 0)
            L = (f or 0) + (l or 0) + middle * V * rnd(1, 4)
            if (f or l) and middle == 0 then L = f + l end
            opts.first_layers, opts.last_layers = f, l
        end
        local ok, cfg = pcall(F.config, { layers = L }, opts)
        if ok then
            accepted = accepted + 1
            local split = partition.split(L, P, V, cfg.first_layers, cfg.last_layers)
            check(L, P, V, split)
            if cfg.first_layers then
                T.eq(split[1][1].count * V, cfg.first_layers, "first stage")
            end
            if cfg.last_layers then
                T.eq(split[P][1].count * V, cfg.last_layers, "last stage")
            end
        elseif not diag.is_user_error(cfg) then
            error(cfg, 0)
        elseif trial % 3 ~= 0 then
            error("a layout built to be valid was refused: " .. diag.lines(cfg)[1], 0)
        end
    end
    T.ok(accepted >= 350, "only %d valid layouts", accepted)
end)

T.done()
