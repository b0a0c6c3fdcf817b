-- sandbox.lua: run a model description (models/*.lua) as pure data.
-- The chunk is loaded as text only (precompiled bytecode is refused, and so is a file over
-- SOURCE bytes), with an environment that holds only pure helpers; it runs in a coroutine whose
-- instruction count and CPU time are bounded by a hook (and the CPU time also by the allocator,
-- host.cpu_deadline, for work done inside C functions), under a memory cap (host.mem_limit),
-- with the string metatable narrowed to safe functions. Any failure becomes a user error
-- located at the model's line. Called by config.lua only.

local diag = require("diag")
local host = require("host")

local M = {}

M.INSTRUCTIONS = 10000000       -- a model file needs a few thousand
M.MEMORY = 64 * 1024 * 1024     -- bytes a model may allocate
M.SECONDS = 1                   -- CPU time a model may take (it needs well under a millisecond)
M.SOURCE = 1024 * 1024          -- bytes of source text a model file may have
M.MOVE = 1 << 22                -- most elements of one table.move (more than fit in MEMORY)

local HOOK_EVERY = 100          -- instructions between the hook's checks of the budgets
local CLOCK_CALLS = 16          -- function calls between its reads of the clock (calls of C
                                -- functions can take long without running an instruction)

local FORBIDDEN_WHY = "models are pure data: no I/O, no commands"

-- Names a model may not use, with the reason shown in the error.
local forbidden = {
    io = FORBIDDEN_WHY, os = FORBIDDEN_WHY, print = FORBIDDEN_WHY,
    require = FORBIDDEN_WHY, dofile = FORBIDDEN_WHY, loadfile = FORBIDDEN_WHY,
    load = "models cannot load code", loadstring = "models cannot load code",
    package = FORBIDDEN_WHY, debug = "models cannot inspect the generator",
    collectgarbage = "models cannot control the generator",
    coroutine = "models run straight through",
    rawget = "models have no metatables to bypass",
    rawset = "models have no metatables to bypass",
    rawequal = "models have no metatables to bypass",
    rawlen = "models have no metatables to bypass",
    setmetatable = "models are plain tables: no metatables, no finalizers",
    getmetatable = "models are plain tables: no metatables, no finalizers",
    _G = "a model sees only its own names",
}

-- Members of string/math a model may use. Pattern matching (find, match, gsub, gmatch) runs
-- in C beyond the instruction hook's reach, dump makes bytecode, random breaks determinism.
local STRING_OK = { "byte", "char", "format", "len", "lower", "upper", "rep", "reverse", "sub" }
local MATH_OK = { "abs", "ceil", "floor", "fmod", "huge", "log", "exp", "max", "maxinteger",
                  "min", "mininteger", "modf", "pi", "sqrt", "tointeger", "type", "ult" }
local TABLE_OK = { "concat", "insert", "move", "pack", "remove", "sort", "unpack" }

-- Library functions that would run unbounded inside C, where the hook cannot stop them,
-- replaced by checked versions: string.rep of an empty string loops 'n' times, table.move
-- walks every index from f to e, and table.sort's own comparison loops without returning to
-- Lua (a huge table, or long strings to compare), so it is given a Lua comparison.
local checked = {
    string = {
        rep = function(s, n, sep)
            local count = tonumber(n)
            if s == "" and (sep == nil or sep == "") and count then n = math.min(count, 1) end
            return string.rep(s, n, sep)
        end,
    },
    table = {
        move = function(a1, f, e, t, a2)
            local fi, ei = math.tointeger(f), math.tointeger(e)
            if fi and ei and ei >= fi and (ei - fi < 0 or ei - fi >= M.MOVE) then
                error(string.format("table.move of more than %d elements", M.MOVE), 2)
            end
            return table.move(a1, f, e, t, a2)
        end,
        sort = function(t, less)
            return table.sort(t, less or function(a, b) return a < b end)
        end,
    },
}

-- A read-only view of some members of 'lib'; a missing member is an error naming it.
local function library(libname, lib, names, file)
    local members = {}
    for _, n in ipairs(names) do members[n] = (checked[libname] or {})[n] or lib[n] end
    return setmetatable({}, {
        __index = function(_, k)
            local v = members[k]
            if v == nil then
                error(diag.make({ file = file }, "'%s.%s' is not available in model descriptions",
                                libname, tostring(k)), 0)
            end
            return v
        end,
        __newindex = function()
            error(diag.make({ file = file }, "'%s' is read-only", libname), 0)
        end,
    })
end

-- The global environment of a model chunk: the helpers in 'extra' plus pure basics.
local function environment(file, extra)
    local safe_string = library("string", string, STRING_OK, file)
    local env = {
        math = library("math", math, MATH_OK, file),
        string = safe_string,
        table = library("table", table, TABLE_OK, file),
        pairs = pairs, ipairs = ipairs, next = next, select = select, type = type,
        tostring = tostring, tonumber = tonumber, error = error, assert = assert,
        unpack = table.unpack,
    }
    for k, v in pairs(extra) do env[k] = v end
    setmetatable(env, {
        __index = function(_, k)
            local why = forbidden[k]
            if why then
                error(diag.make({ file = file },
                                "'%s' is not available in model descriptions (%s)", k, why), 0)
            end
            error(diag.make({ file = file }, "'%s' is not defined", tostring(k)), 0)
        end,
    })
    return env, safe_string
end

-- The innermost line of 'file' on the (dead) coroutine's stack, or nil.
local function model_line(co, source)
    local level = 0
    while true do
        local info = debug.getinfo(co, level, "Sl")
        if not info then return nil end
        if info.source == source and info.currentline and info.currentline > 0 then
            return info.currentline
        end
        level = level + 1
    end
end

-- A model's error message as printed: its first line, control characters escaped, at most
-- 200 characters (a hostile file must not flood or rewrite the terminal).
local function printable(msg)
    msg = msg:match("^[^\n]*"):gsub("%c", function(c) return "\\" .. c:byte() end)
    if #msg > 200 then msg = msg:sub(1, 197) .. "..." end
    return msg
end

local function over_time()
    return string.format("model description did not finish within %g s of CPU time", M.SECONDS)
end

-- What Lua's own messages for exhausted limits mean in a model description.
local function explained(msg, late)
    if msg == "not enough memory" and late then
        return over_time()
    elseif msg == "not enough memory" then
        return string.format("model description needs more than %d MiB of memory",
                             M.MEMORY // (1024 * 1024))
    elseif msg == "stack overflow" or msg == "C stack overflow" then
        return msg .. " (recursion too deep)"
    end
    return msg
end

-- Turn whatever the model chunk raised into a located user error. 'late': the CPU-time
-- deadline has passed (a failed allocation is then the deadline's doing).
local function located(err, co, file, source, late)
    local line = model_line(co, source)
    if type(err) == "string" then
        -- "file:line: msg": the model's line is kept; another chunk's place (the checked
        -- library functions above) is dropped for the model's line
        local at, msg = err:match("^[^\n]-:(%d+): (.*)$")
        if at and err:sub(1, #file + 1) == file .. ":" then
            line, err = tonumber(at), msg
        elseif err:match("^[^\n:]-%.lua:%d+: ") then
            err = msg
        end
        return diag.make({ file = file, line = line or 1 }, "%s", explained(printable(err), late))
    end
    -- a table: the model's own {msg=, line=} or a user error raised by the sandbox
    local msg = type(err) == "table" and rawget(err, "msg")
    if type(msg) == "string" then
        local at = rawget(err, "line")
        if math.type(at) ~= "integer" or at < 1 then at = nil end
        return diag.make({ file = file, line = at or line or 1 }, "%s", printable(msg))
    end
    return diag.make({ file = file, line = line or 1 }, "model raised an error (a %s value)",
                     type(err))
end

-- The line at which the Lua parser runs out of C stack in 'src' (nesting too deep): the
-- first line whose prefix of the source already fails that way.
local function too_deep(src, source)
    local ends = {}
    for pos in src:gmatch("()\n") do ends[#ends + 1] = pos end
    ends[#ends + 1] = #src
    local lo, hi = 1, #ends
    while lo < hi do
        local mid = (lo + hi) // 2
        local _, err = load(src:sub(1, ends[mid]), source, "t", {})
        if err and err:match("^C stack overflow") then hi = mid else lo = mid + 1 end
    end
    return lo
end

-- Run model source 'src' named 'file' (as shown in messages) with helper globals 'extra'.
-- Returns the chunk's first return value; raises a user error on any failure.
function M.run(src, file, extra)
    if src:sub(1, 4) == "\27Lua" then
        diag.error({ file = file, line = 1 }, "precompiled Lua bytecode is not accepted: " ..
                   "a model description must be Lua source text")
    end
    if #src > M.SOURCE then
        diag.error({ file = file, line = 1 }, "model description is larger than %d KiB " ..
                   "(a model file needs a few)", M.SOURCE // 1024)
    end
    local env, safe_string = environment(file, extra or {})
    local source = "@" .. file
    local chunk, perr = load(src, source, "t", env)
    if not chunk then
        local line, msg = perr:match("^[^\n]-:(%d+): (.*)$")
        if not msg and perr:match("^C stack overflow") then
            line, msg = too_deep(src, source), "nested too deeply for the Lua parser " ..
                        "(C stack overflow)"
        end
        diag.error({ file = file, line = tonumber(line) or 1 }, "%s",
                   explained(printable(msg or perr)))
    end

    local co = coroutine.create(chunk)
    local steps, calls, deadline = 0, 0, os.clock() + M.SECONDS
    debug.sethook(co, function(event)
        if event == "count" then
            steps = steps + HOOK_EVERY
            if steps >= M.INSTRUCTIONS then
                error(diag.make(nil, "model description did not finish within %d instructions",
                                M.INSTRUCTIONS), 0)
            end
        else
            calls = calls + 1
            if calls % CLOCK_CALLS ~= 0 then return end
        end
        if os.clock() > deadline then error(diag.make(nil, "%s", over_time()), 0) end
    end, "c", HOOK_EVERY)

    local string_mt = getmetatable("")
    local string_index = string_mt.__index
    local old_cap = host.mem_limit(host.mem_used() + M.MEMORY)
    host.cpu_deadline(deadline)
    string_mt.__index = safe_string
    -- (pcall: past the deadline even the generator's own allocations fail until it is lifted)
    local resumed, ok, result = pcall(coroutine.resume, co)
    host.cpu_deadline(nil)
    string_mt.__index = string_index
    host.mem_limit(old_cap)
    if not resumed then ok, result = false, ok end

    if not ok then
        local err = located(result, co, file, source, os.clock() > deadline)
        co, result = nil, nil
        collectgarbage()
        error(err, 0)
    end
    return result
end

return M
