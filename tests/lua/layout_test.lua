-- tests/lua/layout_test.lua: the pipeline-placement knobs of issue 16 §3, pass by pass:
-- the layout grammar (Megatron's parse_str_to_list: commas, (..)*n, x*n, '|'), how its
-- virtual stages map to (pp rank, chunk), the config rules (Megatron's validate_layer_layout,
-- the accounting flags, the micro-batch group N), chunks with no layers through the program,
-- and the interleaved schedule with N != P through the verifier.
-- Run: build/gen --lua tests/lua/layout_test.lua

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
require("strict")
local T = require("harness")("layout")
local F = require("fixtures")
local partition = require("partition")
local program = require("program")
local schedule = require("schedule")
local verify = require("verify")

-- "E t3|t1|..." : the parsed stages as partition.stage_text, joined by '|'.
local function stages_text(str)
    local stages, why = partition.parse_layout(str)
    if not stages then return nil, why end
    local w = {}
    for i, st in ipairs(stages) do w[i] = partition.stage_text(st) end
    return table.concat(w, "|")
end

-- {{"-", "0..3"}, ...}: the layers of every (stage, chunk), "-" for none.
local function table_of(split)
    local out = {}
    for p, chunks in ipairs(split) do
        out[p] = {}
        for v, c in ipairs(chunks) do
            out[p][v] = c.count == 0 and "-" or c.count == 1 and tostring(c.first)
                        or string.format("%d..%d", c.first, c.first + c.count - 1)
        end
    end
    return out
end

-- -- The grammar ---------------------------------------------------------------------------

T.test("grammar: Megatron's docstring example Ettt|(tt|)*29,m|L", function()
    local stages = partition.parse_layout("Ettt|(tt|)*29,m|L")
    T.eq(#stages, 32, "virtual stages")
    T.eq(partition.stage_text(stages[1]), "E t3", "first")
    for i = 2, 30 do T.eq(partition.stage_text(stages[i]), "t2", "stage " .. i) end
    T.eq(partition.stage_text(stages[31]), "m1", "mtp")
    T.eq(partition.stage_text(stages[32]), "L", "loss")
end)

T.test("grammar: repeats, cosmetic commas, empty stages", function()
    T.eq(stages_text("E|(t|)*3,m|m||L"), "E|t1|t1|t1|m1|m1|empty|L", "docs example")
    T.eq(stages_text("E|t*4|t*4|L"), "E|t4|t4|L", "x*n")
    T.eq(stages_text("(|Et)*2,tL"), "empty|E t1|E t2 L", "(|ab)*2,cd")
    T.eq(stages_text("Et,t,t|t*0L"), "E t3|L", "commas and *0")
    T.eq(stages_text("E(tt)*2|t*10L"), "E t4|t10 L", "(..)*n inside a stage")
    T.eq(stages_text(""), "empty", "the empty string is one empty stage")
end)

T.test("grammar: refused characters and sizes", function()
    local ok, why = stages_text("E|t*4|x|L")
    T.ok(not ok and why:find("unknown layer character 'x' in virtual stage 2", 1, true),
         "x: %s", tostring(why))
    ok, why = stages_text("E|T|L")
    T.ok(not ok and why:find("'T'", 1, true), "upper-case t: %s", tostring(why))
    ok, why = stages_text("E|((t)*2)*2|L")     -- no nesting: the inner ')' ends the body
    T.ok(not ok and why:find("'('", 1, true), "nested: %s", tostring(why))
    ok, why = stages_text("E|t*99999999|L")
    T.ok(not ok and why:find("expands to more than", 1, true), "long: %s", tostring(why))
end)

-- -- Stages -> (pp rank, chunk) ------------------------------------------------------------

T.test("split: virtual stage s is chunk s // P of stage s % P, layers in string order",
       function()
    T.eq(table_of(partition.layout_split(partition.parse_layout("E|t*4|t*4|L"), 4)),
         { { "-" }, { "0..3" }, { "4..7" }, { "-" } }, "E|t*4|t*4|L, P=4")
    T.eq(table_of(partition.layout_split(partition.parse_layout("Et*3|t|t*2||t*2|L"), 2)),
         { { "0..2", "4..5", "6..7" }, { "3", "-", "-" } }, "P=2, V=3")
    -- Megatron's own docs table (PP16 VP2, 61 layers + MTP): the first and the last ranks
    local split = partition.layout_split(partition.parse_layout("Et*3|(tt|)*29,m|L"), 16)
    T.eq(table_of(split)[1], { "0..2", "33..34" }, "pp rank 0")
    T.eq(table_of(split)[16], { "31..32", "-" }, "pp rank 15 (its second chunk: mtp, loss)")
end)

T.test("partition.build: a layout's chunks and duties", function()
    local _, _, part = F.build({ layers = 8 }, { pp = 4, layout = "E|t*4|t*4|L", nmb = 4 })
    local st = part.stages
    T.eq({ st[1].count, st[2].count, st[3].count, st[4].count }, { 0, 4, 4, 0 }, "counts")
    T.ok(st[1].chunks[1].embedding and st[4].chunks[1].head, "embedding and head chunks")
    T.eq(program.stage_title(st[1]), "embedding", "stage 0's title")
    T.eq(program.stage_title(st[4]), "head + loss", "stage 3's title")
    local _, _, p2 = F.build({ layers = 8 }, { pp = 2, layout = "Et*3|t|t*2||t*2|L", nmb = 4 })
    T.eq(program.stage_title(p2.stages[2]), "layer 3 | no layers | head + loss", "P=2 V=3")
end)

-- -- Config rules --------------------------------------------------------------------------

T.test("config: a layout sets VP; what it cannot be combined with", function()
    local cfg = F.config({ layers = 8 }, { pp = 2, layout = "E|(t*2|)*4L", nmb = 4 })
    T.eq({ cfg.vp, cfg.layout }, { 3, "E|(t*2|)*4L" }, "vp from the layout")
    T.ok(cfg.dirname:find("-layout-E_t2x4_L", 1, true), "dirname %s", cfg.dirname)
    T.ok(cfg.make:find("LAYOUT='E|(t*2|)*4L'", 1, true), "make %s", cfg.make)
    T.raises("VP cannot be given with LAYOUT", F.config, { layers = 8 },
             { pp = 2, vp = 3, layout = "E|(t*2|)*4L", nmb = 4 })
    T.raises("LAYOUT cannot be combined with FIRST_LAYERS or ACCOUNT_LOSS", F.config,
             { layers = 8 }, { pp = 2, layout = "Et*4|t*4L", first_layers = 4,
                               account_loss = true })
    T.raises("multiple of PP (3)", F.config, { layers = 8 }, { pp = 3, layout = "Et*4|t*4L" })
end)

T.test("config: Megatron's validate_layer_layout and where E and L must be", function()
    local function bad(layout, text, P)
        T.raises(text, F.config, { layers = 8 }, { pp = P or 2, layout = layout, nmb = 4 })
    end
    bad("Et*4|t*4mL", "multi-token prediction is not supported")
    bad("t*4|t*4L", "place the embedding E exactly once (it has 0)")
    bad("EEt*4|t*4L", "place the embedding E exactly once (it has 2)")
    bad("tEt*3|t*4L", "must start with the embedding E")
    bad("|Et*4|t*4|L", "must start with the embedding E")
    bad("Et*4L|t*4L", "place the loss L exactly once (it has 2)")
    bad("Et*4|Lt*4", "must end with the loss L")
    bad("Et*4|t*4|L|", "must end with the loss L")
    bad("Et*4|t*3L", "places 7 transformer layers ('t'), but the model has 8")
    -- what Megatron accepts, these programs accept: empty stages, E or L alone
    for _, ok in ipairs({ { "E|t*8||L", 4 }, { "E|t*8||L", 2 }, { "Et*4||t*4|L", 2 } }) do
        local cfg = F.config({ layers = 8 }, { pp = ok[2], layout = ok[1], nmb = 4 })
        T.eq(cfg.vp, 4 // ok[2], ok[1] .. " over PP " .. ok[2])
    end
end)

T.test("config: the accounting flags (Megatron's TransformerConfig rules)", function()
    local _, _, part = F.build({ layers = 14 }, { pp = 4, vp = 2, nmb = 4,
                                                   account_embedding = true,
                                                   account_loss = true })
    T.eq(table_of(partition.split(14, 4, 2, nil, nil, true, true)),
         { { "0", "7..8" }, { "1..2", "9..10" }, { "3..4", "11..12" }, { "5..6", "13" } },
         "docs/megatron.md 2(a) example")
    local got = {}
    for p, st in ipairs(part.stages) do
        got[p] = {}
        for v, c in ipairs(st.chunks) do got[p][v] = { c.first, c.count } end
    end
    T.eq(got, { { { 0, 1 }, { 7, 2 } }, { { 1, 2 }, { 9, 2 } }, { { 3, 2 }, { 11, 2 } },
                { { 5, 2 }, { 13, 1 } } }, "partition.build")
    T.raises("layers (8) + 1 for the embedding = 9 must be divisible by PP (2)", F.config,
             { layers = 8 }, { pp = 2, account_embedding = true })
    T.raises("each stage's 3 layers (layers 8 + 1 for the loss, over PP 3) must be divisible " ..
             "by VP (2)", F.config, { layers = 8 }, { pp = 3, vp = 2, account_loss = true,
                                                     nmb = 6 })
    T.raises("ACCOUNT_LOSS cannot be combined with LAST_LAYERS", F.config, { layers = 8 },
             { pp = 2, last_layers = 2, account_loss = true })
    -- a chunk of the embedding alone: L=2, P=2, V=2, both flags -> k = 1
    local _, _, p2 = F.build({ layers = 2 }, { pp = 2, vp = 2, nmb = 2,
                                               account_embedding = true, account_loss = true })
    T.eq(program.stage_title(p2.stages[1]), "embedding | layer 1", "stage 0")
    T.eq(program.stage_title(p2.stages[2]), "layer 0 | head + loss", "stage 1")
end)

T.test("config: the micro-batch group N (Megatron's interleaved-schedule rules)", function()
    local cfg = F.config({ layers = 8 }, { pp = 4, vp = 2, nmb = 6, microbatch_group = 6 })
    T.eq(cfg.mb_group, 6, "N")
    T.ok(cfg.dirname:find("-mbg6", 1, true), "dirname %s", cfg.dirname)
    T.eq(F.config({ layers = 8 }, { pp = 4, vp = 2, nmb = 8 }).mb_group, 4, "default N = P")
    T.eq(F.config({ layers = 8 }, { pp = 4, nmb = 8 }).mb_group, nil, "no N without VP")
    T.raises("with VP > 1, NMB (6) must be a multiple of PP (4)", F.config, { layers = 8 },
             { pp = 4, vp = 2, nmb = 6 })
    T.raises("or MICROBATCH_GROUP=6", F.config, { layers = 8 }, { pp = 4, vp = 2, nmb = 6 })
    T.raises("MICROBATCH_GROUP (3) must be between PP (4) and NMB (8)", F.config,
             { layers = 8 }, { pp = 4, vp = 2, nmb = 8, microbatch_group = 3 })
    T.raises("MICROBATCH_GROUP (9) must be between PP (4) and NMB (8)", F.config,
             { layers = 8 }, { pp = 4, vp = 2, nmb = 8, microbatch_group = 9 })
    T.raises("NMB (7) % MICROBATCH_GROUP (5) = 2 must be 0 or at least PP (4)", F.config,
             { layers = 8 }, { pp = 4, vp = 2, nmb = 7, microbatch_group = 5 })
    T.raises("MICROBATCH_GROUP (2) applies to the interleaved schedule only", F.config,
             { layers = 8 }, { pp = 2, nmb = 4, microbatch_group = 2 })
    -- M % N in [P, N) is accepted: P=2, N=3, M=5 (Megatron's source example)
    T.eq(F.config({ layers = 8 }, { pp = 2, vp = 2, nmb = 5, microbatch_group = 3 }).mb_group,
         3, "M % N = 2 >= P")
end)

-- -- The schedule with N != P ---------------------------------------------------------------

T.test("schedule: every valid (P, V, M, N) verifies and runs each F and B once", function()
    local n = 0
    for P = 2, 4 do
        for V = 2, 3 do
            for Mb = P, 9 do
                for N = P, Mb do
                    if Mb % N == 0 or Mb % N >= P then
                        local s = schedule.build(P, V, Mb, N)
                        T.eq(s.N, N, "N")
                        local ok, why = verify.check(s)
                        T.ok(ok, "P=%d V=%d M=%d N=%d: %s", P, V, Mb, N, why and why[1] or "")
                        for r = 0, P - 1 do
                            local f, b = 0, 0
                            for _, st in ipairs(s.stages[r + 1].steps) do
                                if st.kind == "F" then f = f + 1 end
                                if st.kind == "B" then b = b + 1 end
                            end
                            T.ok(f == Mb * V and b == Mb * V, "P=%d V=%d M=%d N=%d r%d: %d F " ..
                                 "%d B", P, V, Mb, N, r, f, b)
                        end
                        n = n + 1
                    end
                end
            end
        end
    end
    T.ok(n >= 60, "only %d schedules", n)
end)

T.test("schedule: N = M puts all micro-batches of chunk 0 first (P=4 V=2 M=6 N=6)", function()
    local s = schedule.build(4, 2, 6, 6)
    T.eq(schedule.order_string(s.stages[4], 2):sub(1, 35),
         "F0.0 F1.0 F2.0 F3.0 F4.0 F5.0 F0.1 ", "last stage's warm-up, then chunk 1")
    T.raises("must be between PP (4) and NMB (6)", schedule.check_sizes, 4, 2, 6, 3)
    T.raises("NMB (5) % the micro-batch group (4) = 1", schedule.check_sizes, 2, 2, 5, 4)
end)

T.test("program: a layout with chunks of no layers builds, plans and verifies", function()
    for _, case in ipairs({ { pp = 4, layout = "E|t*8||L", nmb = 4 },
                            { pp = 2, layout = "Et*3|t|t*2||t*2|L", nmb = 5,
                              microbatch_group = 3 },
                            { pp = 2, vp = 5, account_embedding = true, account_loss = true,
                              nmb = 4 } }) do
        local cfg, _, _, _, _, prog = F.build({ layers = 8 }, case)
        T.ok(prog, "%s: no program", cfg.dirname)
        T.eq(#prog.stages, cfg.pp, cfg.dirname .. ": stages")
    end
end)

T.done()
