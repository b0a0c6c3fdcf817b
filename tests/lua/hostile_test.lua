-- tests/lua/hostile_test.lua: model files written to hurt the generator (issue 17). Keys given
-- twice in any table (and the shapes that only look so), the sandbox's bounds on time, memory,
-- recursion and nesting, numbers that are not sizes, tables with metatables, odd error objects;
-- and the generator left as it was afterwards. (Exact messages: tests/errors/dup_*, hostile_*.)
-- Run: build/gen --lua tests/lua/hostile_test.lua

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
require("strict")
local T = require("harness")("hostile")
local config = require("config")
local diag = require("diag")
local sandbox = require("sandbox")

local GPT = "return gpt { layers = 2, hidden = 32, heads = 2, seq_len = 16, vocab = 99 }"

local function load(src)
    return config.model_from_source(src, "m.lua", "m")
end

-- Every line of the error that loading 'src' raises.
local function errors(src)
    local ok, err = pcall(load, src)
    T.ok(not ok, "expected an error from: %s", src:sub(1, 60))
    T.ok(diag.is_user_error(err), "not a user error: %s", tostring(err))
    return diag.lines(err)
end

-- Run f with sandbox.SECONDS set to 'seconds', restoring it whatever happens.
local function with_seconds(seconds, f)
    local old = sandbox.SECONDS
    sandbox.SECONDS = seconds
    local ok, err = pcall(f)
    sandbox.SECONDS = old
    if not ok then error(err, 0) end
end

T.test("a key given twice is an error at the second, naming the first", function()
    local cases = {
        { "local t = { a = 1, b = 2, a = 3 }", 1, "a", 1 },
        { "local t = {\n  a = 1,\n  b = 2,\n  a = 3 }", 4, "a", 2 },
        { "local t = { a = 1; a = 2 }", 1, "a", 1 },
        { "local t = { a = 1,\n ['a'] = 2 }", 2, "a", 1 },
        { "local t = { [\"k\"] = 1,\n [ 'k' ] = 2 }", 2, "k", 1 },
        { "local t = { f = function() end,\n f = 2 }", 2, "f", 1 },
        { "local t = { [1] = 2, x = {}, y = (1),\n x = 3 }", 2, "x", 1 },
        { "local t = { inner = { k = 1,\n k = 2 } }", 2, "k", 1 },
        { "local function f()\n  if true then return { x = 1,\n x = 2 } end\nend", 3, "x", 2 },
        { "local t = { a\n = 1, a = 2 }", 2, "a", 1 },
        { "local t = { s = 'x = 1, x = 2', s = 2 }", 1, "s", 1 },
        { "local t = { x = 1, y = function() end; x = 2 }", 1, "x", 1 },
        { "local t = { ['" .. ("k"):rep(100) .. "'] = 1, ['" .. ("k"):rep(100) .. "'] = 2 }", 1,
          ("k"):rep(37) .. "...", 1 },
    }
    for _, c in ipairs(cases) do
        local lines = errors(c[1] .. "\n" .. GPT)
        T.eq(lines[1], string.format("m.lua:%d: error: key '%s' is given twice in this table " ..
                                     "(first at line %d)", c[2], c[3], c[4]), c[1])
    end
    -- three times: two errors, each naming the first; other problems are reported too. (Lua
    -- kept layers = 2 and dropped the 0 without a word: only the scan of the source sees it.)
    local lines = errors("local t = { a = 1,\n a = 2,\n a = 3 }\n" ..
                         "return gpt { layers = 0, hidden = 32, heads = 2, seq_len = 16,\n" ..
                         "             vocab = 99, layers = 2, heads = 3 }")
    T.eq(lines, { "m.lua:2: error: key 'a' is given twice in this table (first at line 1)",
                  "m.lua:3: error: key 'a' is given twice in this table (first at line 1)",
                  "m.lua:4: error: hidden (32) must be divisible by heads (3)",
                  "m.lua:5: error: key 'heads' is given twice in this table (first at line 4)",
                  "m.lua:5: error: key 'layers' is given twice in this table (first at line 4)" },
         "every repeat, with the other problems")
end)

T.test("shapes that repeat a name without repeating a key are accepted", function()
    local shapes = {
        "local a, b = 1, 2\nlocal t = { f = function() a = 1; a = 2 end, g = 1 }",
        "local t = { f = function() local u = { a = 1 }; return { a = 2 } end }",
        "local a, b = 1, 2\nlocal t = { x = a == b, y = a == b, z = (a == b) }",
        "local t = { x = 1, inner = { x = 2, inner = { x = 3 } } }",
        "local t = { s = \"x = 1, x = 2\", u = 'x = 1, x = 2', v = [[x = 1, x = 2]] }",
        "local t = { w = [==[ x = 1, x = 2 ]==], y = 1 }",
        "local t = { x = 1, --[[ x = 2, ]] y = 2 } -- x = 3",
        "local t, u = { x = 1 }, { x = 2 }",
        "local x = 1\nlocal t = { x, x, x, [1] = 1, [2] = 2 }",
        "local t = { [ [[a]] ] = 1, [ [[b]] ] = 2, [ [=[c]=] ] = 3 }",
        "local t = { ['a\\98'] = 1, ['a\\99'] = 2 }",
        "local t = { s = \"a\\\"b = 1\", b = 1 }",
        "local t = { f = function(v) if v then return { y = 1 } else return { y = 2 } end end }",
        "local t = { f = function() local i = 0 repeat i = i + 1 until i > 2 return i end, " ..
            "i = 1 }",
        "local t = { f = function() for i = 1, 2 do local j = i end while false do end end, " ..
            "i = 1, j = 2 }",
        "local t = { n = 1e5, m = 0x1F, k = 1 .. 2, l = 3.5e-2 }",
        "local g = gpt { layers = 2, hidden = 32, heads = 2, seq_len = 16, vocab = 99 }",
    }
    for _, s in ipairs(shapes) do
        local ok, err = pcall(load, s .. "\n" .. GPT)
        T.ok(ok, "%s: %s", s, ok or table.concat(diag.is_user_error(err) and diag.lines(err)
                                                  or { tostring(err) }, " | "))
    end
end)

T.test("the key scan takes linear time", function()
    local fields = {}
    for i = 1, 20000 do fields[i] = string.format("k%d = { x = %d, y = 'x = 1' }", i, i) end
    local src = "local t = { " .. table.concat(fields, ",\n") .. " }\n" .. GPT
    local t0 = os.clock()
    load(src)
    T.ok(os.clock() - t0 < 2, "%d bytes took %.2f s", #src, os.clock() - t0)
    T.eq(#errors("local t = { " .. table.concat(fields, ",\n") .. ",\n k1 = 1 }\n" .. GPT),
         1, "one repeat among 20000 keys")
end)

T.test("numbers that are not sizes", function()
    local function first(field, v)
        return errors(string.format("local v = %s\nreturn gpt { layers = 2, hidden = 32, " ..
                                    "heads = 2, seq_len = 16, vocab = 99,\n %s = v }", v, field))[1]
    end
    T.eq(first("vocab_pad", "0/0"), "m.lua:3: error: vocab_pad must be an integer (got nan)", "nan")
    T.eq(first("vocab_pad", "math.huge"), "m.lua:3: error: vocab_pad must be an integer (got inf)",
         "inf")
    T.eq(first("vocab_pad", "-math.huge"),
         "m.lua:3: error: vocab_pad must be an integer (got -inf)", "-inf")
    T.eq(first("vocab_pad", "1e308"), "m.lua:3: error: vocab_pad must be an integer (got 1e+308)",
         "1e308")
    T.eq(first("vocab_pad", "-0.0"), "m.lua:3: error: vocab_pad must be an integer (got -0.0, " ..
         "a float: use // for integer division)", "negative zero")
    T.eq(first("vocab_pad", "math.maxinteger"), string.format("m.lua:3: error: vocab_pad (%d) " ..
         "is too large (at most %d)", math.maxinteger, 1 << 20), "maxinteger")
    T.eq(first("vocab_pad", "math.mininteger"), string.format("m.lua:3: error: vocab_pad must " ..
         "be at least 1 (got %d)", math.mininteger), "mininteger")
    T.eq(first("norm_eps", "0/0"), "m.lua:3: error: norm_eps must be a finite number (got nan)",
         "float nan")
    T.eq(first("init_std", "math.huge"),
         "m.lua:3: error: init_std must be a finite number (got inf)", "float inf")
    T.eq(first("init_std", "-0.0"), "m.lua:3: error: init_std must be greater than 0 (got -0.0)",
         "float negative zero")
    T.eq(first("norm_eps", "1e39"), "m.lua:3: error: norm_eps (1e+39) is out of range: the " ..
         "programs hold it in a float (1.2e-38 to 3.4e+38, or 0)", "beyond a float")
    T.ok(first("norm_eps", "1e-40"):find("norm_eps (1e-40) is out of range", 1, true),
         "below a normal float")
    T.eq(first("description", "0/0"), "m.lua:3: error: description must be a string (got nan)",
         "nan where a string goes")
    -- a non-negative zero is zero, whatever its sign
    local m = load("return gpt { layers = 2, hidden = 32, heads = 2, seq_len = 16, vocab = 99,\n" ..
                   "  moe = moe { experts = 4, top_k = 2, aux_loss_coeff = -0.0 } }")
    T.ok(1 / m.moe.aux_loss_coeff == math.huge, "-0.0 became 0.0")
    -- keys that are not names
    T.eq(errors("return gpt { [math.huge] = 1, layers = 2, hidden = 32, heads = 2, " ..
                "seq_len = 16, vocab = 99 }")[1],
         "m.lua:1: error: gpt{} takes named fields only (found a value at [inf])", "inf key")
    local lines = errors("return gpt { layers = 2, hidden = 32, heads = 2, seq_len = 16, " ..
                         "vocab = 99, [string.rep('x\\n', 100)] = 1 }")
    T.ok(#lines[1] < 240 and not lines[1]:find("\n"), "a long odd key is cut: %s", lines[1])
end)

T.test("tables with metatables are not fields", function()
    local cases = {
        { "return gpt(string)", "m.lua:1: error: gpt expects a table" },
        { "return gpt(_ENV)", "m.lua:1: error: gpt expects a table" },
        { "local g = llama(math)\nreturn g", "m.lua:1: error: llama expects a table" },
        { "return gpt { layers = 2, hidden = 32, heads = 2, seq_len = 16, vocab = 99,\n" ..
          "  moe = moe(table) }", "m.lua:2: error: moe expects a table" },
        { "return gpt { layers = 2, hidden = 32, heads = 2, seq_len = 16, vocab = 99,\n" ..
          "  moe = string }", "m.lua:2: error: moe must be made with moe{" },
    }
    for _, c in ipairs(cases) do
        local line = errors(c[1])[1]
        T.ok(line:sub(1, #c[2]) == c[2], "%s -> %s", c[1], line)
    end
    T.eq(errors("local t = { layers = 2 }\nfor i = 1, 1000 do t[i] = i end\nreturn gpt(t)")[1],
         "m.lua:3: error: gpt{} has 1001 fields (it knows 12)", "too many fields")
end)

T.test("odd error objects from the model", function()
    local cases = {
        { "error({ msg = 'x', line = 1e308 })", "m.lua:1: error: x" },
        { "error({ msg = 'x', line = -3 })", "m.lua:1: error: x" },
        { "\nerror({ msg = 'x', line = 'two' })", "m.lua:2: error: x" },
        { "error({ msg = 'x', line = 1, file = '/etc/passwd' })", "m.lua:1: error: x" },
        { "error({ errors = {} })", "m.lua:1: error: model raised an error (a table value)" },
        { "error(math)", "m.lua:1: error: model raised an error (a table value)" },
        { "error(_ENV)", "m.lua:1: error: model raised an error (a table value)" },
        { "error('a\\nb')", "m.lua:1: error: a" },
        { "error('\\27[31mred\\0', 0)", "m.lua:1: error: \\27[31mred\\0" },
        { "error('gen/lua/config.lua:12: fake', 0)", "m.lua:1: error: fake" },
    }
    for _, c in ipairs(cases) do
        local lines = errors(c[1] .. "\n" .. GPT)
        T.eq(lines[1], c[2], c[1])
        T.eq(#lines, 1, c[1] .. ": one line")
    end
    local line = errors("error(string.rep('x', 1 << 20))\n" .. GPT)[1]
    T.eq(#line, #"m.lua:1: error: " + 200, "a long message is cut")
end)

T.test("recursion and nesting", function()
    T.eq(errors("local function f(n) return 1 + f(n + 1) end\nf(1)\n" .. GPT)[1],
         "m.lua:1: error: stack overflow (recursion too deep)", "Lua recursion")
    T.eq(errors("local function f() table.sort({ 2, 1 }, function(a, b) f() return a < b end) " ..
                "end\nf()\n" .. GPT)[1],
         "m.lua:1: error: C stack overflow (recursion too deep)", "recursion through C")
    local n, m = 100000, 20000      -- m: where n would pass sandbox.SOURCE
    local deep = {
        tables = "local t = " .. ("{"):rep(n) .. ("}"):rep(n),
        parens = "local t = " .. ("("):rep(n) .. "1" .. (")"):rep(n),
        concat = "local s = 'a'" .. (" .. 'a'"):rep(n),
        power = "local x = 2" .. (" ^ 2"):rep(n),
        unary = "local b = " .. ("not "):rep(n) .. "true",
        minus = "local x = " .. ("- "):rep(n) .. "1",
        blocks = ("do "):rep(n) .. ("end "):rep(n),
        functions = ("local f = function() "):rep(m) .. (" end"):rep(m),
        ifs = ("if true then "):rep(m) .. ("end "):rep(m),
        index = "local t = {}\nlocal x = t" .. ("[t"):rep(n) .. ("]"):rep(n),
        calls = "local x = tostring" .. ("(tostring"):rep(n) .. (")"):rep(n),
    }
    for name, src in pairs(deep) do
        local t0 = os.clock()
        local line = errors("-- deep\n" .. src .. "\n" .. GPT)[1]
        T.ok(line:find("^m%.lua:%d+: error: ") and (line:find("nested too deeply", 1, true) or
             line:find("too many", 1, true) or line:find("overflow", 1, true)),
             "%s: %s", name, line)
        T.ok(os.clock() - t0 < 1, "%s took %.2f s", name, os.clock() - t0)
    end
    -- the line is where the parser gave up, not line 1
    local lines = {}
    for i = 1, 1000 do lines[i] = "(" end
    local line = errors("local x =\n" .. table.concat(lines, "\n") .. "1" .. (")"):rep(1000) ..
                        "\n" .. GPT)[1]
    local at = tonumber(line:match("^m%.lua:(%d+): error: nested too deeply"))
    T.ok(at and at > 100 and at < 250, "deep parentheses, one a line: %s", line)
    T.eq(errors("local x = 1\nlocal t = " .. ("{"):rep(1000) .. ("}"):rep(1000) .. "\n" .. GPT)[1],
         "m.lua:2: error: nested too deeply for the Lua parser (C stack overflow)", "located")
end)

T.test("memory and huge strings", function()
    local cases = {
        { "local s = string.rep('x', 2^40)", "m.lua:1: error: resulting string too large" },
        { "local s = ('x'):rep(1 << 30)",
          "m.lua:1: error: model description needs more than 64 MiB of memory" },
        { "local s = 'x'\nfor i = 1, 64 do s = s .. s end",
          "m.lua:2: error: model description needs more than 64 MiB of memory" },
        { "local t = {}\nfor i = 1, 1e8 do t[i] = i end",
          "m.lua:2: error: model description needs more than 64 MiB of memory" },
        { "local t = {}\nfor i = 1, 1e8 do t = { t } end",
          "m.lua:2: error: model description needs more than 64 MiB of memory" },
        { "local s = table.concat({ ('x'):rep(1 << 24), ('x'):rep(1 << 24) }, ('y'):rep(1 << 24))",
          "m.lua:1: error: model description needs more than 64 MiB of memory" },
        { "local t = { table.unpack({}, 1, 1 << 30) }",
          "m.lua:1: error: too many results to unpack" },
        { "local s = string.char(table.unpack({}, 1, 1e6))",
          "m.lua:1: error: too many results to unpack" },
        { "local t = table.move({}, 1, 1 << 62, 1, {})",
          "m.lua:1: error: table.move of more than 4194304 elements" },
        { "local t = table.move({}, math.mininteger, math.maxinteger, 1, {})",
          "m.lua:1: error: table.move of more than 4194304 elements" },
        { ("--"):rep(sandbox.SOURCE // 2 + 1),
          "m.lua:1: error: model description is larger than 1024 KiB (a model file needs a few)" },
    }
    for _, c in ipairs(cases) do
        local t0 = os.clock()
        T.eq(errors(c[1] .. "\n" .. GPT)[1], c[2], c[1]:sub(1, 60))
        T.ok(os.clock() - t0 < 1, "%s took %.2f s", c[1]:sub(1, 60), os.clock() - t0)
    end
end)

T.test("library functions that would loop in C are bounded or checked", function()
    -- each model asserts what it got; loading it fails if an assertion does
    local fine = {
        "assert((''):rep(1 << 62) == '' and string.rep('', 1 << 62, '') == '')",
        "assert(string.rep('', 3, ',') == ',,' and ('ab'):rep(2, '-') == 'ab-ab')",
        "assert(('x'):rep(0) == '' and ('x'):rep(-5) == '' and ('x'):rep(2.0) == 'xx')",
        "local t = table.move({ 1, 2, 3 }, 1, 3, 2)\nassert(t[4] == 3 and #t == 4)",
        "local t = table.move({ 1, 2 }, 1, 0, 5, {})\nassert(next(t) == nil)",
        "local t = { 3, 1, 2 }\ntable.sort(t)\nassert(t[1] == 1 and t[3] == 3)",
        "local t = { 'b', 'c', 'a' }\ntable.sort(t, function(a, b) return a > b end)\n" ..
            "assert(table.concat(t) == 'cba')",
    }
    for _, s in ipairs(fine) do
        local ok, err = pcall(load, s .. "\n" .. GPT)
        T.ok(ok, "%s: %s", s, ok or table.concat(diag.is_user_error(err) and diag.lines(err)
                                                  or { tostring(err) }, " | "))
    end
    local bad = {
        { "local t = { 3, 'a', 1 }\ntable.sort(t)", "m.lua:2: error: attempt to compare " },
        { "local s = ('x'):rep(0.5)", "m.lua:1: error: bad argument #2 to 'rep'" },
        { "local s = ('x'):rep(0/0)", "m.lua:1: error: bad argument #2 to 'rep'" },
        { "local s = (''):rep('many')", "m.lua:1: error: bad argument #2 to 'rep'" },
        { "local t = table.move({}, 1, 'x', 1)", "m.lua:1: error: bad argument #3 to 'move'" },
    }
    for _, c in ipairs(bad) do
        local line = errors(c[1] .. "\n" .. GPT)[1]
        T.ok(line:sub(1, #c[2]) == c[2], "%s -> %s", c[1], line)
        T.ok(not line:find("gen/lua", 1, true), "no generator path in: %s", line)
    end
end)

T.test("CPU time is bounded, work inside C functions included", function()
    with_seconds(0.2, function()
        local slow = {
            compare = "local a, b = ('x'):rep(1 << 24) .. 'a', ('x'):rep(1 << 24) .. 'b'\n" ..
                      "while a < b do end",
            concat = "local a = ('x'):rep(1 << 24)\nwhile true do local s = a .. a .. a end",
            rep = "while true do local s = ('x'):rep(1 << 25) end",
            sort = "local a, b = ('x'):rep(1 << 22) .. 'a', ('x'):rep(1 << 22) .. 'b'\n" ..
                   "local t = {}\nfor i = 1, 100000 do t[i] = i % 2 == 0 and a or b end\n" ..
                   "table.sort(t)",
            shift = "local t = {}\nfor i = 1, 3000000 do t[i] = i end\n" ..
                    "while true do table.insert(t, 1, 0); table.remove(t, 1) end",
            concat_table = "local t = {}\nfor i = 1, 1000000 do t[i] = 'abcdefgh' end\n" ..
                           "while true do local s = table.concat(t) end",
            calls = "local function f(n) if n > 0 then return f(n - 1) + 1 end return 0 end\n" ..
                    "while true do f(100) end",
        }
        for name, src in pairs(slow) do
            local t0 = os.clock()
            local line = errors(src .. "\n" .. GPT)[1]
            local took = os.clock() - t0
            T.ok(line:find("did not finish within 0.2 s of CPU time", 1, true) or
                 line:find("did not finish within 10000000 instructions", 1, true),
                 "%s: %s", name, line)
            T.ok(took < 1.2, "%s: stopped after %.2f s of CPU time (limit 0.2 s)", name, took)
        end
    end)
    -- what the model left behind does not count against the generator
    T.eq(#string.rep("x", 100 << 20), 100 << 20, "no memory cap or deadline left")
    T.ok(debug.gethook() == nil, "no hook left on the main thread")
    T.ok(getmetatable("").__index == string, "string metatable restored")
end)

T.done()
