-- sandbox.lua: run a model description (models/*.lua) as pure data.
-- The chunk is loaded as text only (precompiled bytecode is refused), with an environment that
-- holds only pure helpers; it runs in a coroutine whose instruction count is bounded by a hook,
-- under a memory cap (host.mem_limit), with the string metatable narrowed to safe functions.
-- Any failure becomes a user error located at the model's line. Called by config.lua only.

local diag = require("diag")
local host = require("host")

local M = {}

M.INSTRUCTIONS = 10000000       -- a model file needs a few thousand
M.MEMORY = 64 * 1024 * 1024     -- bytes a model may allocate

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

-- A read-only view of some members of 'lib'; a missing member is an error naming it.
local function library(libname, lib, names, file)
    local members = {}
    for _, n in ipairs(names) do members[n] = lib[n] end
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

-- Turn whatever the model chunk raised into a located user error.
local function located(err, co, file, source)
    local line = model_line(co, source)
    if type(err) == "string" then
        local at, msg = err:match("^[^\n]-:(%d+): (.*)$")
        if at and err:sub(1, #file + 1) == file .. ":" then
            line, err = tonumber(at), msg
        end
        if err == "not enough memory" then
            err = string.format("model description needs more than %d MiB of memory",
                                M.MEMORY // (1024 * 1024))
        end
        return diag.make({ file = file, line = line or 1 }, "%s", err)
    end
    if type(err) == "table" and type(err.msg) == "string" then
        return diag.make({ file = file, line = err.line or line or 1 }, "%s", err.msg)
    end
    return diag.make({ file = file, line = line or 1 }, "model raised an error (a %s value)",
                     type(err))
end

-- Run model source 'src' named 'file' (as shown in messages) with helper globals 'extra'.
-- Returns the chunk's first return value; raises a user error on any failure.
function M.run(src, file, extra)
    if src:sub(1, 4) == "\27Lua" then
        diag.error({ file = file, line = 1 }, "precompiled Lua bytecode is not accepted: " ..
                   "a model description must be Lua source text")
    end
    local env, safe_string = environment(file, extra or {})
    local source = "@" .. file
    local chunk, perr = load(src, source, "t", env)
    if not chunk then
        local line, msg = perr:match("^[^\n]-:(%d+): (.*)$")
        diag.error({ file = file, line = tonumber(line) or 1 }, "%s", msg or perr)
    end

    local co = coroutine.create(chunk)
    debug.sethook(co, function()
        error(diag.make(nil, "model description did not finish within %d instructions",
                        M.INSTRUCTIONS), 0)
    end, "", M.INSTRUCTIONS)

    local string_mt = getmetatable("")
    local string_index = string_mt.__index
    local old_cap = host.mem_limit(host.mem_used() + M.MEMORY)
    string_mt.__index = safe_string
    local ok, result = coroutine.resume(co)
    string_mt.__index = string_index
    host.mem_limit(old_cap)

    if not ok then
        local err = located(result, co, file, source)
        co, result = nil, nil
        collectgarbage()
        error(err, 0)
    end
    return result
end

return M
