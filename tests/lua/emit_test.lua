-- tests/lua/emit_test.lua: the output files and the driver's modes. topology.json has exactly
-- the issue's keys and agrees with the passes; shards.json parses and agrees; MANIFEST lists
-- every file; rendering is repeatable; reports fit 100 columns; --dump, --print-out,
-- --check, --inspect print what they should; write leaves no temporary files.
-- Run: build/gen --lua tests/lua/emit_test.lua

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
require("strict")
local T = require("harness")("emit")
local F = require("fixtures")
local config = require("config")
local driver = require("driver")
local emit = require("emit")
local inspect = require("inspect")
local partition = require("partition")
local reports = require("reports")
local schedule = require("schedule")
local shards = require("shards")
local topology = require("topology")

local SCRATCH = "build/test/lua/emit"

-- cfg, topo, part, sh, sched for a model file and sizes, without the program (the build-time
-- picture alone, as --topology-only renders it).
local function build(name, opts)
    local cfg = config.configure(config.load_model(name), opts)
    local topo = topology.build(cfg)
    local part = partition.build(cfg, topo)
    return cfg, topo, part, shards.build(cfg, topo, part), schedule.build(cfg.pp, cfg.vp, cfg.nmb)
end

-- Everything driver.run writes to stdout for 'opts'.
local function captured(opts)
    local out, write = {}, io.write
    io.write = function(...)
        for _, s in ipairs({ ... }) do out[#out + 1] = tostring(s) end
    end
    local ok, err = pcall(driver.run, opts)
    io.write = write
    if not ok then error(err, 0) end
    return table.concat(out)
end

T.test("topology.json: the issue's keys, consistent with the passes", function()
    local cfg, topo, part = build("tiny_moe", { tp = 2, pp = 2, dp = 2, ep = 2, etp = 1, vp = 2,
                                                nmb = 2, sp = true })
    local j = T.json(reports.topology_json(cfg, topo, part))
    T.eq(j.keys, { "model", "world", "order", "format", "sizes", "grids", "kinds", "listed",
                   "groups", "ranks" }, "top-level keys")
    T.eq(j.map.format, "topology/2", "format")
    T.eq(j.map.listed, true, "a small world lists its groups")
    for i, kind in ipairs(topo.kinds) do
        local jk = j.map.kinds[i].map
        T.eq({ jk.name, jk.grid, jk.size, jk.count }, { kind.name, kind.grid, kind.size,
             kind.count }, "kind " .. kind.name)
    end
    local jd = j.map.grids.map.dense.map
    T.eq({ jd.axes, jd.sizes, jd.strides }, { topo.dense.axes, topo.dense.sizes,
         topo.dense.strides }, "dense grid")
    T.eq({ j.map.model, j.map.world, j.map.order }, { "tiny_moe", 8, "tp-cp-ep-dp-pp" }, "header")
    T.eq(j.map.sizes.keys, { "tp", "cp", "dp", "pp", "ep", "etp", "edp", "vp" }, "sizes keys")
    T.eq(j.map.sizes.map, { tp = 2, cp = 1, dp = 2, pp = 2, ep = 2, etp = 1, edp = 2, vp = 2 },
         "sizes")
    T.eq(j.map.groups.keys, { "tp", "pp", "dp", "cp", "dp-cp", "mp", "tp-dp", "tp-dp-cp", "tp-cp",
                              "ep", "expt-tp", "expt-dp", "tp-ep", "tp-ep-pp", "embd", "pos-embd" },
         "group kinds")
    for _, kind in ipairs(topo.kinds) do
        T.eq(j.map.groups.map[kind.name], F.groups(topo, kind.name), kind.name)
    end
    T.eq(#j.map.ranks, 8, "ranks")
    for r = 0, 7 do
        local e = j.map.ranks[r + 1]
        T.eq(e.keys, { "rank", "tp", "cp", "dp", "pp", "ep", "etp", "edp", "chunks", "embedding",
                       "head" }, "rank keys")
        local c = topology.coords(topo, r)
        T.eq({ e.map.rank, e.map.tp, e.map.cp, e.map.dp, e.map.pp, e.map.ep, e.map.etp, e.map.edp },
             { r, c.tp, c.cp, c.dp, c.pp, c.ep, c.etp, c.edp }, "coordinates of " .. r)
        local st = part.stages[c.pp + 1]
        for v, ch in ipairs(st.chunks) do
            local layers = {}
            for l = ch.first, ch.first + ch.count - 1 do layers[#layers + 1] = l end
            T.eq(e.map.chunks[v].keys, { "vp", "layers" }, "chunk keys")
            T.eq({ e.map.chunks[v].map.vp, e.map.chunks[v].map.layers }, { v - 1, layers }, "chunk")
        end
        T.eq({ e.map.embedding, e.map.head }, { c.pp == 0, c.pp == 1 }, "duties")
    end
end)

T.test("shards.json parses and agrees with the pass", function()
    local cfg, topo, part, sh, sched, prog = build("tiny_moe", { tp = 2, pp = 2, dp = 2, ep = 2, etp = 1,
                                                   sp = true })
    local j = T.json(reports.shards_json(cfg, sh))
    T.eq(j.map.format, "shards/2", "format")
    T.eq(j.map.class_of_rank.map.key, { "pp", "tp", "ep", "etp" }, "a rank's class key")
    T.eq({ j.map.unique, j.map.unique_expert }, { sh.unique, sh.unique_expert }, "counts")
    T.eq(#j.map.classes, #sh.classes, "classes")
    for i, c in ipairs(sh.classes) do
        local jc = j.map.classes[i].map
        T.eq({ jc.id, jc.pp, jc.tp, jc.ep, jc.etp, jc.ranks, jc.numel },
             { c.id, c.pp, c.tp, c.ep, c.etp, c.ranks, c.numel }, "class header")
        T.eq(#jc.params, #c.params, "params")
        for k, p in ipairs(c.params) do
            local jp = jc.params[k].map
            T.eq({ jp.name, jp.shape, jp.local_shape, jp.numel, jp.reduce, jp.tied },
                 { p.name, p.shape, p.local_shape, p.numel, p.reduce, p.tied }, p.name)
            T.eq(#jp.pieces, #p.pieces, "pieces")
            for n, pc in ipairs(p.pieces) do
                T.eq({ jp.pieces[n].map.start, jp.pieces[n].map.size, jp.pieces[n].map.at },
                     { pc.start, pc.size, pc.at }, "piece")
            end
        end
        T.eq(#jc.bytes, 6, "3 dtypes x 2 optimizers")
    end
    local _ = topo, part
end)

T.test("MANIFEST, repeatable rendering, writing", function()
    local cfg, topo, part, sh, sched, prog = build("tiny", { tp = 2, pp = 2, dp = 2 })
    local a = emit.render(cfg, topo, part, sh, sched, prog)
    local b = emit.render(build("tiny", { tp = 2, pp = 2, dp = 2 }))
    T.eq(#a, 5, "five files (with schedule.svg)")
    for i = 1, #a do T.ok(a[i].text == b[i].text, "%s differs between renders", a[i].name) end
    local manifest = a[#a].text
    for _, f in ipairs(a) do
        T.ok(manifest:find("\n" .. f.name .. " ", 1, true), "MANIFEST lists %s", f.name)
    end
    T.ok(manifest:find("# regenerate: make MODEL=tiny TP=2 PP=2 DP=2\n", 1, true), "regenerate")
    for _, f in ipairs(a) do
        T.ok(not f.text:find(host.root(), 1, true), "%s holds the absolute root", f.name)
    end
    os.execute("rm -rf " .. SCRATCH)
    emit.write(SCRATCH .. "/out", a)
    for _, f in ipairs(a) do
        local h = assert(io.open(SCRATCH .. "/out/" .. f.name, "rb"))
        T.ok(h:read("a") == f.text, "%s written whole", f.name)
        h:close()
        T.ok(not host.exists(SCRATCH .. "/out/." .. f.name .. ".tmp"), "temporary left")
    end
    -- a directory that cannot be made: a user error, nothing written
    local h = assert(io.open(SCRATCH .. "/file", "w"))
    h:close()
    T.raises("cannot create directory", emit.write, SCRATCH .. "/file/out", a)
end)

T.test("reports fit 100 columns", function()
    local cases = {
        { "tiny", { tp = 2, pp = 2, dp = 2 } },
        { "tiny_moe", { tp = 2, ep = 4, dp = 4, etp = 1, sp = true, pp = 2, vp = 2, nmb = 2 } },
        { "gpt3_175b", { tp = 8, pp = 8, dp = 16, order = "tp-pp-dp" } },
        { "gpt3_175b", { tp = 8, pp = 8, dp = 16, cp = 2 } },
        { "mixtral_5b", { tp = 4, pp = 4, dp = 8, ep = 8, etp = 1, sp = true, first_layers = 3,
                          last_layers = 3, dist_opt = true } },
    }
    for _, c in ipairs(cases) do
        local cfg, topo, part, sh, sched, prog = build(c[1], c[2])
        local texts = { inspect.summary(cfg, topo, part, sh, sched, prog) }
        for _, r in ipairs({ 0, cfg.world // 2 + 1, cfg.world - 1 }) do
            texts[#texts + 1] = inspect.rank(cfg, topo, part, sh, sched, prog, r)
        end
        for _, text in ipairs(texts) do
            for line in text:gmatch("[^\n]*") do
                T.ok(#line <= 100, "%s: %d columns: %s", c[1], #line, line)
            end
        end
    end
end)

T.test("summary: one row per rank, or per stage for large worlds", function()
    local cfg, topo, part, sh, sched, prog = build("tiny", { tp = 2, pp = 2, dp = 2 })
    local text = inspect.summary(cfg, topo, part, sh, sched, prog)
    T.ok(text:find("ranks by stage", 1, true), "per-rank table")
    local rows = 0
    for line in text:gmatch("[^\n]+") do
        if line:match("^" .. string.rep("%s+%d+", 8) .. "%s") then rows = rows + 1 end
    end
    T.eq(rows, 8, "a row per rank")
    cfg, topo, part, sh, sched, prog = build("gpt3_175b", { tp = 8, pp = 8, dp = 1024 })
    text = inspect.summary(cfg, topo, part, sh, sched, prog)
    T.ok(text:find("\nstages\n", 1, true), "per-stage table")
    T.ok(text:find("    7  57344-65535 (8192)", 1, true), "rank range of stage 7")
    T.ok(text:find("174,604,259,328 unique", 1, true), "unique count")
end)

T.test("rank report: coordinates, groups, neighbours, shards, memory", function()
    local cfg, topo, part, sh, sched, prog = build("gpt3_175b", { tp = 8, pp = 8 })
    local text = inspect.rank(cfg, topo, part, sh, sched, prog, 37)
    for _, want in ipairs({
        "rank 37 of 64", "attention grid  tp 5  cp 0  dp 0  pp 4",
        "expert grid     etp 5  ep 0  edp 0  pp 4", "prev rank 29, next rank 45",
        "layers 48-59 (12)", "  tp           8      4      5  32-39",
        "  pp           8      5      4  5-61 step 8", "not the first or last stage",
        "h.48.attn.c_attn.weight", "[:, 7680:9216]", "memory on this rank",
    }) do
        T.ok(text:find(want, 1, true), "missing %q", want)
    end
    local _ = cfg
end)

T.test("524,288 ranks: compact reports, any rank's report exact, nothing per rank", function()
    -- gpt3_175b TP8 PP8 DP8192 (tp fastest, then dp, then pp: rank = tp + 8 dp + 65536 pp)
    local cfg, topo, part, sh, sched = build("gpt3_175b", { tp = 8, pp = 8, dp = 8192 })
    T.eq(cfg.world, 524288, "world")
    local j = T.json(reports.topology_json(cfg, topo, part))
    T.eq(j.map.listed, false, "groups are not listed")
    T.ok(j.map.groups == nil and j.map.ranks == nil, "no per-rank lists")
    T.eq(#sh.classes, 64, "classes: pp x tp")
    local r = 300000
    local text = inspect.rank(cfg, topo, part, sh, sched, nil, r)
    local tp, dp, pp = r % 8, (r // 8) % 8192, r // 65536
    for _, want in ipairs({   -- kind, size, group, index, members (patterns, spaces free)
        string.format("rank %d of 524288", r),
        string.format("attention grid  tp %d  cp 0  dp %d  pp %d", tp, dp, pp),
        string.format("tp +8 +%d +%d +%d%%-%d\n", r // 8, tp, r - tp, r - tp + 7),
        string.format("dp +8192 +%d +%d +%d%%-%d step 8\n", pp * 8 + tp, dp, pp * 65536 + tp,
                      pp * 65536 + tp + 8 * 8191),
        string.format("prev rank %d, next rank %d", r - 65536, r + 65536),
    }) do
        T.ok(text:find(want), "missing %q", want)
    end
    local summary = inspect.summary(cfg, topo, part, sh, sched, nil)
    T.ok(summary:find("    4  262144-327679 (65536)", 1, true), "stage 4's ranks")
end)

T.test("driver modes: --dump, --print-out, --check, --inspect", function()
    T.eq(captured({ model = "tiny", tp = 2, print_out = true }), "out/tiny-tp2-pp1-dp1\n",
         "--print-out")
    T.eq(captured({ model = "tiny", tp = 2, check = true }), "", "--check prints nothing")
    local c = T.json(captured({ model = "tiny", tp = 2, dump = "config" }))
    T.eq({ c.map.tp, c.map.world, c.map.model.map.name }, { 2, 2, "tiny" }, "dump config")
    local t = T.json(captured({ model = "tiny", tp = 2, dp = 2, dump = "topology" }))
    T.eq(t.map.world, 4, "dump topology")
    local p = T.json(captured({ model = "tiny", pp = 2, dump = "partition" }))
    T.eq(#p.map.stages, 2, "dump partition")
    local s = T.json(captured({ model = "tiny", tp = 2, dump = "shards" }))
    T.eq(#s.map.classes, 2, "dump shards")
    local schema = T.json(captured({ model = "tiny", dump = "schema" }))
    T.ok(#schema > 10, "dump schema")
    local summary = captured({ model = "tiny", tp = 2, inspect = true })
    T.ok(summary:find("ranks by stage", 1, true), "--inspect")
    local one = captured({ model = "tiny", tp = 2, inspect = true, rank = 1 })
    T.ok(one:find("rank 1 of 2", 1, true), "--inspect --rank")
end)

T.done()
