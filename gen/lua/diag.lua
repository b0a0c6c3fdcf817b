-- diag.lua: user errors and warnings of the generator's passes (STYLE 2.4).
-- A user error is raised as a table {file=, line=, msg=} or {errors = {those...}} with
-- error(obj, 0); the C host prints each as "file:line: error: msg" (or "gen: error: msg" when
-- there is no location), then "gen: no output written", and exits 1. Anything else that is
-- raised is a generator bug (exit 3). Warnings are printed here, to stderr, and do not stop.

local M = {}

M.CAP = 20      -- most errors reported by one run (DynASM caps its list the same way)

-- Make an error record. 'at' is {file=, line=} or nil (no location).
function M.make(at, fmt, ...)
    return { file = at and at.file, line = at and at.line, msg = string.format(fmt, ...) }
end

-- Raise one user error now.
function M.error(at, fmt, ...)
    error(M.make(at, fmt, ...), 0)
end

-- Is 'e' (a value caught by pcall) a user error raised through this module?
function M.is_user_error(e)
    return type(e) == "table" and (type(e.msg) == "string" or type(e.errors) == "table")
end

-- The text the host prints for one error record (for tests).
function M.format(rec, kind)
    kind = kind or "error"
    if rec.file and rec.line then
        return string.format("%s:%d: %s: %s", rec.file, rec.line, kind, rec.msg)
    elseif rec.file then
        return string.format("%s: %s: %s", rec.file, kind, rec.msg)
    end
    return string.format("gen: %s: %s", kind, rec.msg)
end

-- Every line of a raised user error, in order.
function M.lines(e)
    local out = {}
    for _, rec in ipairs(e.errors or { e }) do out[#out + 1] = M.format(rec) end
    return out
end

-- Print a warning to stderr now.
function M.warn(at, fmt, ...)
    io.stderr:write(M.format(M.make(at, fmt, ...), "warning"), "\n")
end

-- Raise the error records in 'list' together (nothing when it is empty). Beyond CAP they are
-- counted in one last line.
function M.raise(list)
    if #list == 0 then return end
    if #list == 1 then error(list[1], 0) end
    local errs = {}
    for i = 1, math.min(#list, M.CAP) do errs[i] = list[i] end
    if #list > M.CAP then
        local more = #list - M.CAP
        errs[#errs + 1] = M.make(nil, "%d more error%s not shown", more, more == 1 and "" or "s")
    end
    error({ errors = errs }, 0)
end

-- A collector: add() problems as they are found, raise() them together at the end.
function M.collect()
    local c = { list = {} }
    function c.add(at, fmt, ...) c.list[#c.list + 1] = M.make(at, fmt, ...) end
    function c.count() return #c.list end
    function c.raise() M.raise(c.list) end
    return c
end

return M
