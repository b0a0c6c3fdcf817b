-- tests/lua/harness.lua: the few lines every pure-pass test needs (run by build/gen --lua).
--   local T = require("harness")("topology")      -- suite name shown as lua/topology/<test>
--   T.test("example A", function() T.eq(got, want, "tp groups") end)
-- Each test prints "PASS lua/<suite>/<test>" or "FAIL lua/<suite>/<test>: why" (DESIGN.md 3).
-- Also: a tiny seeded random generator (same numbers on every run) and a minimal JSON
-- reader that keeps key order, to check emitted files.

local diag = require("diag")

local function show(v)
    if type(v) ~= "table" then return tostring(v) end
    local parts = {}
    for i = 1, math.min(#v, 12) do parts[i] = show(v[i]) end
    if #v > 12 then parts[#parts + 1] = "... (" .. #v .. ")" end
    return "{" .. table.concat(parts, ",") .. "}"
end

-- Deep equality of plain values and arrays/tables; returns ok, path of the first difference.
local function same(a, b, path)
    if type(a) ~= "table" or type(b) ~= "table" then
        if a == b and math.type(a) == math.type(b) then return true end
        return false, path
    end
    for k, v in pairs(a) do
        local ok, where = same(v, b[k], path .. "." .. tostring(k))
        if not ok then return false, where end
    end
    for k in pairs(b) do
        if a[k] == nil then return false, path .. "." .. tostring(k) end
    end
    return true
end

return function(suite)
    local T = { failed = 0, passed = 0 }

    function T.test(name, fn)
        local label = "lua/" .. suite .. "/" .. name:gsub("[^%w_.-]+", "_")
        local ok, err = xpcall(fn, function(e)
            if diag.is_user_error(e) then
                return "unexpected user error: " .. table.concat(diag.lines(e), " | ")
            end
            return debug.traceback(tostring(e), 2)
        end)
        if ok then
            T.passed = T.passed + 1
            print("PASS " .. label)
        else
            T.failed = T.failed + 1
            local first = tostring(err):match("^[^\n]*")
            print("FAIL " .. label .. ": " .. first)
            io.stderr:write(tostring(err), "\n")
        end
    end

    function T.eq(got, want, what)
        local ok, where = same(got, want, "")
        if not ok then
            error(string.format("%s: got %s, want %s%s", what or "value", show(got), show(want),
                                where ~= "" and (" (differs at " .. where .. ")") or ""), 2)
        end
    end

    function T.ok(cond, what, ...)
        if not cond then error(string.format(what or "check failed", ...), 2) end
    end

    -- Call f(...) expecting a user error whose first line contains 'text'; returns the lines.
    function T.raises(text, f, ...)
        local ok, err = pcall(f, ...)
        if ok then error("expected an error containing '" .. text .. "', got none", 2) end
        if not diag.is_user_error(err) then
            error("expected a user error, got: " .. tostring(err), 2)
        end
        local lines = diag.lines(err)
        if not lines[1]:find(text, 1, true) then
            error("expected an error containing '" .. text .. "', got: " .. lines[1], 2)
        end
        return lines
    end

    -- A deterministic generator (xorshift64*), so a failing case can be rerun exactly.
    function T.random(seed)
        local s = seed ~ 0x9E3779B97F4A7C15
        return function(lo, hi)
            s = s ~ (s >> 12); s = s ~ (s << 25); s = s ~ (s >> 27)
            local x = (s * 0x2545F4914F6CDD1D) >> 1
            return lo + x % (hi - lo + 1)
        end
    end

    -- Parse JSON text. Objects become {keys = {...in order}, map = {k = v}}; arrays are Lua
    -- arrays; null is T.null.
    T.null = setmetatable({}, { __name = "null" })
    function T.json(text)
        local i = 1
        local function ws() i = text:find("[^ \t\r\n]", i) or #text + 1 end
        local value
        local function str()
            local j, out = i + 1, {}
            while true do
                local c = text:sub(j, j)
                if c == '"' then break end
                if c == "\\" then
                    local e = text:sub(j + 1, j + 1)
                    local map = { n = "\n", t = "\t", r = "\r", b = "\b", f = "\f" }
                    if e == "u" then
                        out[#out + 1] = utf8.char(tonumber(text:sub(j + 2, j + 5), 16))
                        j = j + 6
                    else
                        out[#out + 1] = map[e] or e
                        j = j + 2
                    end
                else
                    out[#out + 1] = c
                    j = j + 1
                end
                assert(j <= #text, "json: unterminated string")
            end
            i = j + 1
            return table.concat(out)
        end
        value = function()
            ws()
            local c = text:sub(i, i)
            if c == "{" then
                i = i + 1
                local o = { keys = {}, map = {} }
                ws()
                if text:sub(i, i) == "}" then i = i + 1; return o end
                while true do
                    ws()
                    assert(text:sub(i, i) == '"', "json: key expected at " .. i)
                    local k = str()
                    ws()
                    assert(text:sub(i, i) == ":", "json: ':' expected at " .. i)
                    i = i + 1
                    assert(o.map[k] == nil, "json: duplicate key " .. k)
                    o.keys[#o.keys + 1] = k
                    o.map[k] = value()
                    ws()
                    local d = text:sub(i, i)
                    i = i + 1
                    if d == "}" then return o end
                    assert(d == ",", "json: ',' or '}' expected at " .. (i - 1))
                end
            elseif c == "[" then
                i = i + 1
                local a = {}
                ws()
                if text:sub(i, i) == "]" then i = i + 1; return a end
                while true do
                    a[#a + 1] = value()
                    ws()
                    local d = text:sub(i, i)
                    i = i + 1
                    if d == "]" then return a end
                    assert(d == ",", "json: ',' or ']' expected at " .. (i - 1))
                end
            elseif c == '"' then
                return str()
            elseif text:find("^true", i) then i = i + 4; return true
            elseif text:find("^false", i) then i = i + 5; return false
            elseif text:find("^null", i) then i = i + 4; return T.null
            end
            local num = text:match("^-?%d+%.?%d*[eE]?[-+]?%d*", i)
            assert(num and #num > 0, "json: value expected at " .. i)
            i = i + #num
            return math.tointeger(tonumber(num)) or tonumber(num)
        end
        local v = value()
        ws()
        assert(i > #text, "json: trailing text at " .. i)
        return v
    end

    -- Print the tally to stderr; the suite counts PASS/FAIL lines.
    function T.done()
        if T.failed > 0 then
            io.stderr:write(string.format("%s: %d failed\n", suite, T.failed))
        end
    end

    return T
end
