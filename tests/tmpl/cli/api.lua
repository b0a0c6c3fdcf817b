-- api.lua: the Lua API of the module `tmpl` (run: build/gen --lua THIS). Prints "testing ..."
-- per group and "OK" at the end; any failed assert is an internal error (exit 3).
local tmpl = require("tmpl")
local host = require("host")
local C = "tests/tmpl/cases/"

local function checkerror(pattern, f, ...)
    local ok, err = pcall(f, ...)
    assert(not ok, "no error, expected: " .. pattern)
    local text = type(err) == "table" and err.msg or tostring(err)
    assert(text:find(pattern, 1, true), ("error %q does not contain %q"):format(text, pattern))
    return err
end

local function newlines(s)
    return select(2, s:gsub("\n", ""))
end

local function read(path)
    local f = assert(io.open(host.root() .. "/" .. path, "rb"))
    local s = f:read("a")
    f:close()
    return s
end

print("testing the module table")
for _, k in ipairs({ "render", "compile", "lua_source" }) do
    assert(type(tmpl[k]) == "function", "tmpl." .. k)
end
assert(package.loaded.tmpl == tmpl and rawget(_G, "tmpl") == nil,
       "tmpl is a module, not a global")

print("testing line alignment of the generated Lua (template line N = Lua line N)")
local list = assert(io.popen("ls " .. C .. "*.tmpl " .. C .. "inc/*.tmpl"))
local checked = 0
for path in list:lines() do
    local ok, src = pcall(tmpl.lua_source, path)
    if ok then
        -- the Lua source ends with "end\n" on the template's last line
        local want = newlines(read(path)) + 1
        assert(newlines(src) == want,
               ("%s: %d template newlines, %d Lua newlines"):format(path, want - 1, newlines(src)))
        assert(load(src, "=" .. path), path .. ": generated Lua does not load")
        checked = checked + 1
    end
end
list:close()
assert(checked >= 10, "too few templates checked: " .. checked)

print("testing compile, render and the cache")
local env = dofile(C .. "blocks.env.lua")
local f = tmpl.compile(C .. "blocks.tmpl")
assert(type(f) == "function")
local out = f(env)
assert(out == read(C .. "blocks.out"), "compile(path)(env) differs from blocks.out")
for _ = 1, 3 do
    assert(tmpl.render(C .. "blocks.tmpl", env) == out, "render is not deterministic")
end
assert(tmpl.compile(C .. "blocks.tmpl")(env) == out)

print("testing options")
local lenv, lopts = dofile(C .. "linedirs.env.lua")
assert(tmpl.render(C .. "linedirs.tmpl", lenv, lopts) == read(C .. "linedirs.out"))
local plain = tmpl.render(C .. "linedirs.tmpl", lenv)
assert(not plain:find("#line", 1, true), "#line without options.line_dirs")
assert(tmpl.compile(C .. "linedirs.tmpl")(lenv, { line_dirs = true }) == read(C .. "linedirs.out"))

print("testing values")
assert(tmpl.render(C .. "inc/sub.tmpl", { kind = math.mininteger })
       == "  sub -9223372036854775808\n")
assert(tmpl.render(C .. "inc/sub.tmpl", { kind = "" }) == "  sub \n")
local sub = C .. "inc/sub.tmpl"
checkerror("float value for '{{ kind }}'", tmpl.render, sub, { kind = 2.0 })
checkerror("function value for '{{ kind }}'", tmpl.render, sub, { kind = print })
-- environments and arrays with metatables are indexed normally
local proxy = setmetatable({}, {
    __index = function(_, k) return k == "kind" and "via __index" end })
assert(tmpl.render(C .. "inc/sub.tmpl", proxy) == "  sub via __index\n")
local arr = setmetatable({}, { __len = function() return 2 end,
                               __index = function(_, i) return i * 10 end })
local aenv = dofile(C .. "array.env.lua")
aenv.xs = arr
assert(tmpl.render(C .. "array.tmpl", aenv):sub(1, 7) == "10,20,\n")

print("testing error objects")
local e = checkerror("'{% end %}' without an open", tmpl.render, C .. "err_stray_end.tmpl", {})
assert(type(e) == "table", "syntax errors are located error tables")
assert(e.file == C .. "err_stray_end.tmpl" and e.line == 4 and e.col == 4, "file/line/col")
assert(e.source == "{% end %}", "source line")
e = checkerror("undefined variable 'nope'", tmpl.render, C .. "err_undefined.tmpl", { name = "x" })
assert(type(e) == "string" and e:find("^" .. C:gsub("%p", "%%%0") .. "err_undefined%.tmpl:2: "),
       "runtime errors are strings located at the template line: " .. e)
e = checkerror("cannot read template '" .. C .. "nope.tmpl'", tmpl.render, C .. "nope.tmpl", {})
assert(not e:find(host.root(), 1, true), "absolute path in a message: " .. e)
checkerror("bad template path '/etc/passwd'", tmpl.render, "/etc/passwd", {})
checkerror("bad template path", tmpl.compile, "tests/./tmpl/cases/subst.tmpl")
checkerror("table expected", tmpl.render, C .. "subst.tmpl")
checkerror("table expected", tmpl.render, C .. "subst.tmpl", {}, "line_dirs")
checkerror("nested deeper than 64", tmpl.render, C .. "inc/self.tmpl", {})
-- a failed render leaves the engine usable
assert(tmpl.render(C .. "inc/sub.tmpl", { kind = "again" }) == "  sub again\n")

print("OK")
