-- tests/lua/shim.lua: a stand-in for the C host (build/gen) under plain lua5.4, for working on
-- the Lua passes without a compiled generator. Not used by the test suites (they run through
-- build/gen --lua). From the repository root:
--   lua5.4 tests/lua/shim.lua --lua tests/lua/topology_test.lua
--   lua5.4 tests/lua/shim.lua tiny --tp 2 --pp 2 --dp 2 --inspect
-- It provides a fake `host` module (no memory cap) and mimics the host's option parsing and
-- error printing (exit 1 user error, 2 usage, 3 internal).

package.path = "gen/lua/?.lua;tests/lua/?.lua;" .. package.path

package.preload.host = function()
    local H = {}
    function H.root() return "." end
    function H.mkdir_p(p) return os.execute("mkdir -p '" .. p .. "'") or nil, "cannot create " .. p end
    function H.rename(a, b) return assert(os.rename(a, b)) end
    function H.exists(p) local f = io.open(p, "rb"); if f then f:close() end; return f ~= nil end
    function H.is_dir(p) return os.execute("test -d '" .. p .. "'") == true end
    function H.clock() return os.clock() end
    function H.peak_rss_kb()
        for line in io.lines("/proc/self/status") do
            local kb = line:match("^VmHWM:%s*(%d+)")
            if kb then return tonumber(kb) end
        end
    end
    function H.mem_used() return math.floor(collectgarbage("count") * 1024) end
    return H
end

local OPTIONS = {   -- name, kind
    tp = "int", pp = "int", dp = "int", cp = "int", ep = "int", etp = "int", vp = "int",
    ["first-layers"] = "int", ["last-layers"] = "int", mbs = "int", nmb = "int", seq = "int",
    rank = "int", order = "str", out = "str", dump = "str", sp = "flag", ["dist-opt"] = "flag",
    ["print-out"] = "flag", inspect = "flag", check = "flag", ["line-dirs"] = "flag",
}

local function usage(msg)
    io.stderr:write("gen: " .. msg .. "\n")
    os.exit(2)
end

local argv = arg or {}
if argv[1] == "--lua" then
    local script = argv[2]
    local args = {}
    for i = 3, #argv do args[#args + 1] = argv[i] end
    _G.arg = args
    local chunk = assert(loadfile(script))
    local ok, err = xpcall(chunk, debug.traceback)
    if not ok then io.stderr:write(tostring(err), "\n"); os.exit(3) end
    os.exit(0)
end

local opts, i = {}, 1
while i <= #argv do
    local a = argv[i]
    local name = a:match("^%-%-(.+)$")
    if name then
        local kind = OPTIONS[name]
        if not kind then usage("unknown option " .. a) end
        local key = name:gsub("-", "_")
        if kind == "flag" then
            opts[key] = true
        else
            i = i + 1
            local v = argv[i] or usage(a .. " needs a value")
            if kind == "int" then
                v = math.tointeger(tonumber(v)) or usage(a .. " needs an integer")
            end
            opts[key] = v
        end
    else
        if opts.model then usage("more than one model") end
        opts.model = a
    end
    i = i + 1
end

local diag = require("diag")
local ok, err = xpcall(function() return require("driver").run(opts) end, function(e)
    if diag.is_user_error(e) then return e end
    return debug.traceback(tostring(e), 2)
end)
if not ok then
    if diag.is_user_error(err) then
        for _, line in ipairs(diag.lines(err)) do io.stderr:write(line, "\n") end
        io.stderr:write("gen: no output written\n")
        os.exit(1)
    end
    io.stderr:write("gen: internal error: ", tostring(err), "\n")
    os.exit(3)
end
