-- tests/lua/config_test.lua: model descriptions and sizes. Defaults, the lines errors point
-- at (keys on one line, in comments and strings, nested moe{}), collected errors and their
-- cap, the sandbox leaving the generator as it found it, output directory names and the
-- regenerate command. (Each rule's exact message is checked in tests/errors/.)
-- Run: build/gen --lua tests/lua/config_test.lua

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
require("strict")
local T = require("harness")("config")
local F = require("fixtures")
local config = require("config")
local diag = require("diag")
local sandbox = require("sandbox")

local function load(src)
    return config.model_from_source(src, "m.lua", "m")
end

-- The lines of the error raised by loading 'src' (or configuring it with 'opts').
local function errors(src, opts)
    local ok, err = pcall(function()
        local model = load(src)
        if opts then config.configure(model, opts) end
    end)
    T.ok(not ok, "expected an error")
    T.ok(diag.is_user_error(err), "not a user error: %s", tostring(err))
    return diag.lines(err)
end

T.test("shipped models load with their documented sizes", function()
    local want = {
        gpt3_175b = { 96, 12288, 96, 2048, 50257 }, gpt2_124m = { 12, 768, 12, 1024, 50257 },
        gpt2_350m = { 24, 1024, 16, 1024, 50257 }, gpt2_774m = { 36, 1280, 20, 1024, 50257 },
        gpt2_1558m = { 48, 1600, 25, 1024, 50257 }, tiny = { 8, 64, 4, 64, 256 },
        tiny_moe = { 4, 64, 4, 64, 256 },
    }
    for _, name in ipairs({ "gpt3_175b", "gpt2_124m", "gpt2_350m", "gpt2_774m", "gpt2_1558m",
                            "tiny", "tiny_moe", "mixtral_5b" }) do
        local m = config.load_model(name)
        T.eq(m.name, name, "name")
        T.eq(m.file, "models/" .. name .. ".lua", "file")
        if want[name] then
            T.eq({ m.layers, m.hidden, m.heads, m.seq_len, m.vocab }, want[name], name)
            T.eq(m.ffn_hidden, 4 * m.hidden, name .. " ffn")
        end
    end
    local moe = config.load_model("tiny_moe").moe
    T.eq({ moe.experts, moe.top_k, moe.ffn_hidden, moe.aux_loss_coeff, moe.bias },
         { 8, 2, 128, 0.01, false }, "tiny_moe")
    T.eq(config.load_model("models/tiny.lua").name, "tiny", "a path works too")
end)

T.test("defaults", function()
    local m = load("return gpt { layers = 2, hidden = 32, heads = 2, seq_len = 16, vocab = 99 }")
    T.eq({ m.ffn_hidden, m.norm_eps, m.init_std, m.vocab_pad, m.head_dim },
         { 128, 1e-5, 0.02, 128, 16 }, "model defaults")
    T.ok(m.moe == nil and m.description == nil, "no moe, no description")
    local e = load([[return gpt { layers = 2, hidden = 32, heads = 2, seq_len = 16, vocab = 99,
                                  ffn_hidden = 48, moe = moe { experts = 4, top_k = 2 } }]]).moe
    T.eq({ e.ffn_hidden, e.aux_loss_coeff, e.pre_softmax, e.bias }, { 48, 0.0, false, true },
         "moe defaults")
    T.ok(e.capacity_factor == nil, "no capacity factor")
    local cfg = config.configure(m, {})
    T.eq({ cfg.tp, cfg.pp, cfg.dp, cfg.cp, cfg.ep, cfg.etp, cfg.edp, cfg.vp, cfg.world },
         { 1, 1, 1, 1, 1, 1, 1, 1, 1 }, "sizes")
    T.eq({ cfg.mbs, cfg.nmb, cfg.seq, cfg.sp, cfg.dist_opt, cfg.order },
         { 1, 1, 16, false, false, "tp-cp-ep-dp-pp" }, "knobs")
    T.eq(config.configure(m, { tp = 2 }).etp, 2, "ETP defaults to TP")
    T.eq(config.configure(m, { order = "TP-CP-EP-DP-PP" }).order, "tp-cp-ep-dp-pp", "lower case")
end)

T.test("errors point at the line of the key", function()
    local lines = errors([[
-- hidden = 1 in a comment is not the key
local x = "heads = 3 in a string neither"
return gpt { layers = 4, hidden = 64,
    heads = 12, seq_len = 64, vocab = 256 }
]])
    T.eq(lines[1], "m.lua:4: error: hidden (64) must be divisible by heads (12)", "heads line")
    lines = errors([[
return gpt {
    layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256,
    moe = moe {
        experts = 8,
        top_k = 2,
        ffn_hidden = 100,
    },
    ffn_hidden = 256,
}
]], { tp = 1, etp = 8, dp = 8 })
    T.eq(lines[1], "m.lua:6: error: expert ffn_hidden (100) must be divisible by ETP (8)",
         "moe's ffn_hidden, not gpt's")
    lines = errors([[
local function base(n) return n * 64 end
return gpt {
    layers = 4, hidden = base(1), heads = 4,
    seq_len = 64, vocab = 256,
    ffn_hidden = base(3) + 1,
}
]], { tp = 2 })
    T.eq(lines[1], "m.lua:5: error: ffn_hidden (193) must be divisible by TP (2)", "ffn line")
end)

T.test("all problems are reported together, in line order", function()
    local lines = errors([[
return gpt {
    layers = 0,
    hidden = "x",
    heads = 4.5,
    typo = 1,
    seq_len = 64,
}
]])
    T.eq(lines, {
        "m.lua:1: error: gpt{} needs 'vocab' (vocabulary size)",
        "m.lua:2: error: layers must be at least 1 (got 0)",
        "m.lua:3: error: hidden must be an integer (got string \"x\")",
        "m.lua:4: error: heads must be an integer (got 4.5)",
        "m.lua:5: error: unknown key 'typo' in gpt{} (known keys: layers, hidden, heads, " ..
        "seq_len, vocab, ffn_hidden, norm_eps, init_std, vocab_pad, description, " ..
        "add_bias_linear, moe)",
    }, "errors")
    -- size errors are collected too
    local m = load("return gpt { layers = 5, hidden = 48, heads = 6, seq_len = 64, vocab = 256 }")
    local ok, err = pcall(config.configure, m, { tp = 4, pp = 2, sp = true, cp = 3 })
    T.ok(not ok, "expected errors")
    T.eq(diag.lines(err), {
        "m.lua:1: error: heads (6) must be divisible by TP (4)",
        "m.lua:1: error: seq_len (64) must be divisible by 2*CP = 6 (context parallelism cuts " ..
        "the sequence into 2*CP chunks)",
        "m.lua:1: error: layers (5) must be divisible by PP (2)",
    }, "size errors")
end)

T.test("the error list is capped", function()
    local c = diag.collect()
    for i = 1, 25 do c.add(nil, "problem %d", i) end
    local ok, err = pcall(c.raise)
    T.ok(not ok, "raised")
    local lines = diag.lines(err)
    T.eq(#lines, diag.CAP + 1, "20 errors and a summary")
    T.eq(lines[#lines], "gen: error: 5 more errors not shown", "summary")
end)

T.test("the sandbox leaves the generator as it was", function()
    local mt = getmetatable("")
    local before = mt.__index
    pcall(load, "local s = ('x'):rep(10) ; error('boom')")
    T.ok(getmetatable("").__index == before, "string metatable restored after an error")
    T.ok(("abc"):find("b") == 2, "string methods work again")
    load([[
leaked = 42
return gpt { layers = 2, hidden = 32, heads = 2, seq_len = 16, vocab = 99 }
]])
    T.ok(rawget(_G, "leaked") == nil, "model globals stay in the model")
    T.ok(debug.gethook() == nil, "no hook left on the main thread")
    -- pure helpers are there
    local m = load([[
local h = math.max(2, 3) * string.len("abcd") * #table.concat({ "a", "b" })
return gpt { layers = select("#", 1, 2), hidden = h * 4, heads = 4, seq_len = 16,
             vocab = tonumber("99"), description = string.format("%d wide", h * 4) }
]])
    T.eq({ m.layers, m.hidden, m.vocab, m.description }, { 2, 96, 99, "96 wide" }, "helpers")
end)

T.test("sandbox refusals", function()
    local cases = {
        { "os.exit(1)", "'os' is not available in model descriptions" },
        { "local x = io.read()", "'io' is not available" },
        { "local f = require('io')", "'require' is not available" },
        { "local f = loadstring('x')", "'loadstring' is not available" },
        { "print('hi')", "'print' is not available" },
        { "local g = _G", "'_G' is not available" },
        { "local f = string.gsub", "'string.gsub' is not available" },
        { "local r = math.random(3)", "'math.random' is not available" },
        { "local c = coroutine.create(print)", "'coroutine' is not available" },
        { "local m = getmetatable('')", "'getmetatable' is not available" },
        { "collectgarbage()", "'collectgarbage' is not available" },
        { "string.rep = nil", "'string' is read-only" },
    }
    for _, c in ipairs(cases) do
        local lines = errors(c[1] .. "\nreturn gpt { layers = 2, hidden = 32, heads = 2, " ..
                             "seq_len = 16, vocab = 99 }")
        T.ok(lines[1]:find("m.lua:1: error: " .. c[2], 1, true), "%s -> %s", c[1], lines[1])
    end
    local old = sandbox.INSTRUCTIONS
    sandbox.INSTRUCTIONS = 1000
    local lines = errors("local x = 0\nfor i = 1, 10000 do x = x + i end\nreturn gpt {}")
    sandbox.INSTRUCTIONS = old
    T.eq(lines[1], "m.lua:2: error: model description did not finish within 1000 instructions",
         "instruction limit")
    lines = errors(string.dump(function() return 1 end))
    T.eq(lines[1], "m.lua:1: error: precompiled Lua bytecode is not accepted: a model " ..
                   "description must be Lua source text", "bytecode")
end)

T.test("output directory names and the regenerate command", function()
    local m = config.load_model("tiny_moe")
    local cfg = config.configure(m, {})
    T.eq({ cfg.dirname, cfg.outdir, cfg.make },
         { "tiny_moe-tp1-pp1-dp1", "out/tiny_moe-tp1-pp1-dp1",
           "make MODEL=tiny_moe TP=1 PP=1 DP=1" },
         "defaults")
    cfg = config.configure(m, { tp = 2, pp = 2, dp = 2, etp = 2, cp = 1, ep = 1, vp = 1, mbs = 1,
                                nmb = 1, seq = 64, order = "tp-cp-ep-dp-pp" })
    T.eq(cfg.dirname, "tiny_moe-tp2-pp2-dp2", "defaults given explicitly are left out")
    cfg = config.configure(m, { tp = 2, pp = 2, dp = 2, cp = 2, ep = 2, etp = 1, vp = 2, mbs = 4,
                                nmb = 8, seq = 32, sp = true, dist_opt = true, first_layers = 2,
                                last_layers = 2, order = "tp-cp-ep-dp-pp" })
    T.eq(cfg.dirname, "tiny_moe-tp2-pp2-dp2-cp2-ep2-etp1-vp2-mbs4-nmb8-seq32-sp-distopt" ..
                      "-first2-last2", "every knob")
    T.eq(cfg.make, "make MODEL=tiny_moe TP=2 PP=2 DP=2 CP=2 EP=2 ETP=1 VP=2 MBS=4 NMB=8 SEQ=32 " ..
                   "SP=1 DIST_OPT=1 FIRST_LAYERS=2 LAST_LAYERS=2", "make")
    cfg = config.configure(m, { dp = 2, mbs = 2, gbs = 12 })
    T.eq({ cfg.nmb, cfg.dirname, cfg.make }, { 3, "tiny_moe-tp1-pp1-dp2-mbs2-nmb3",
         "make MODEL=tiny_moe TP=1 PP=1 DP=2 MBS=2 NMB=3" },
         "GBS 12 = MBS 2 x DP 2 x NMB 3 (the micro-batches derived; the directory names NMB)")
    cfg = config.configure(m, { tp = 2, dp = 2, order = "dp-tp-pp", out = "elsewhere" })
    T.eq({ cfg.dirname, cfg.outdir }, { "tiny_moe-tp2-pp1-dp2-orderdp-tp-pp", "elsewhere" },
         "order and --out")
    local other = config.model_from_source(F.source({}), "tests/x/my.lua", "my")
    T.eq(config.configure(other, {}).make, "make MODEL=tests/x/my.lua TP=1 PP=1 DP=1",
         "a model outside models/ is named by its path")
end)

T.test("model names", function()
    T.eq({ config.model_file("tiny") }, { "models/tiny.lua", "tiny" }, "bare name")
    T.eq({ config.model_file("a/b/c.lua") }, { "a/b/c.lua", "c" }, "path")
    T.raises("no model given", config.model_file, nil)
    T.raises("is not a .lua file", config.model_file, "models/x.txt")
    T.raises("may only use", config.model_file, "models/a b.lua")
end)

T.done()
