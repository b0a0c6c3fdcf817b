-- tests/logcmp.lua: the tests' one comparer of training logs (the JSONL files --log writes, one
-- {"step":t,"loss":..,...} object per line). Plain Lua 5.4, no modules.
--
--   lua5.4 tests/logcmp.lua A.jsonl B.jsonl KEY=TOL...
--
-- B is the reference. Both logs must have the same number of lines and the same step on each
-- line; for every KEY given, every line's value of A must be within TOL of B's, relative:
-- |a - b| <= TOL * |b| (TOL * 1 when b is 0). TOL "exact": the same text. A key missing from a
-- line of one log is a mismatch; missing from the lines of both, it is not compared there (a
-- log's evaluation lines have eval_loss but no loss, its step lines the reverse), but a key that
-- no line of B has is a mismatch. Prints the first mismatches, then one line: the largest relative
-- difference per key over the steps, and the first mismatch. Exit 0 same, 1 different, 2 usage
-- or unreadable file.

local function usage(msg)
    io.stderr:write("logcmp.lua: error: " .. msg .. "\n" ..
                    "usage: lua5.4 tests/logcmp.lua A.jsonl B.jsonl KEY=TOL... (TOL: number " ..
                    "or exact)\n")
    os.exit(2)
end

-- every line of a log as { step = "1", loss = "5.5", ... } (values kept as text), in order
local function read_log(path)
    local f = io.open(path, "r")
    if not f then usage("cannot open " .. path) end
    local out = {}
    for line in f:lines() do
        local rec = {}
        for k, v in line:gmatch('"([%w_]+)":%s*([^,}%s]+)') do rec[k] = v end
        out[#out + 1] = rec
    end
    f:close()
    return out
end

if #arg < 3 then usage("want two logs and at least one KEY=TOL") end
local a, b = read_log(arg[1]), read_log(arg[2])
local keys = {}
for i = 3, #arg do
    local key, tol = arg[i]:match("^([%w_]+)=(.+)$")
    if not key or (tol ~= "exact" and not tonumber(tol)) then
        usage("'" .. arg[i] .. "' is not KEY=TOL")
    end
    keys[#keys + 1] = { name = key, exact = tol == "exact", tol = tonumber(tol), worst = 0,
                        seen = 0 }
end

local bad, first, shown = 0, nil, 0
local function mismatch(text)
    bad = bad + 1
    first = first or text
    if shown < 5 then
        shown = shown + 1
        print("  " .. text)
    end
end

if #a ~= #b or #a == 0 then
    mismatch(("%d steps vs %d"):format(#a, #b))
end
for n = 1, math.min(#a, #b) do
    local sa, sb = a[n].step, b[n].step
    if sa ~= sb then mismatch(("line %d: step %s vs %s"):format(n, sa, sb)) end
    for _, k in ipairs(keys) do
        local x, y = a[n][k.name], b[n][k.name]
        local nx, ny = tonumber(x), tonumber(y)
        if y then k.seen = k.seen + 1 end
        if not x and not y then
            -- neither line has it: another kind of line
        elseif not nx or not ny then
            mismatch(("step %s: %s is %s vs %s"):format(sb, k.name, x or "missing",
                                                         y or "missing"))
        else
            local d = math.abs(nx - ny)
            local rel = nx == ny and 0 or d / (ny ~= 0 and math.abs(ny) or 1)
            if rel ~= rel or rel > k.worst then k.worst = rel end
            if (k.exact and x ~= y) or (not k.exact and not (rel <= k.tol)) then
                mismatch(("step %s: %s %s vs %s (rel %.3g)"):format(sb, k.name, x, y, rel))
            end
        end
    end
end

for _, k in ipairs(keys) do
    if k.seen == 0 and #b > 0 then mismatch(("%s: in no line of %s"):format(k.name, arg[2])) end
end
local parts = {}
for _, k in ipairs(keys) do
    parts[#parts + 1] = ("%s %.2g"):format(k.name, k.worst)
end
local line = ("max rel diff %s over %d steps"):format(table.concat(parts, ", "), #b)
if bad > 0 then line = line .. ("; %d mismatches, first: %s"):format(bad, first) end
print(line)
os.exit(bad == 0 and 0 or 1)
