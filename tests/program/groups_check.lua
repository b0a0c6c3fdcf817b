-- tests/program/groups_check.lua: the groups a program builds at start-up (closed form, from
-- the grid description in program.c; train --show-groups prints them) are the generator's
-- (topology.json, which lists every group of a small world).
-- Run: build/gen --lua tests/program/groups_check.lua TOPOLOGY.json SHOW_GROUPS.txt
-- Prints "ok N" (rank-kind pairs compared) or the first differences, and exits 1 on any.

local topo_path, shown_path = arg[1], arg[2]
local groups = {}           -- kind -> list of member lists (strings "a,b,c")
for line in io.lines(topo_path) do
    local kind, body = line:match('^%s*"([%w-]+)": (%[%[.*%]%]),?$')
    if kind then
        local list = {}
        for g in body:gmatch("%[([%d,]+)%]") do list[#list + 1] = g end
        groups[kind] = list
    end
end

local function group_of(kind, rank)
    for _, g in ipairs(groups[kind] or {}) do
        for r in g:gmatch("%d+") do
            if tonumber(r) == rank then return g end
        end
    end
    return "-"
end

local bad, n = 0, 0
for line in io.lines(shown_path) do
    local rank, kind, members = line:match("^rank (%d+): ([%w-]+) ([%d,-]+)$")
    if rank then
        n = n + 1
        local want = group_of(kind, tonumber(rank))
        if want ~= members then
            bad = bad + 1
            if bad <= 10 then
                print(string.format("rank %s %s: the program built %s, topology.json says %s",
                                    rank, kind, members, want))
            end
        end
    end
end
if n == 0 then
    print("no groups printed")
    os.exit(1)
end
if bad > 0 then os.exit(1) end
print("ok " .. n)
