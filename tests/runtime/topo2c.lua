-- tests/runtime/topo2c.lua: convert the generator's topology.json into C group tables for
-- tests/runtime/t_groups.c (the t_config of tests/runtime/t_tables.h). Test tooling only.
--   build/gen --lua tests/runtime/topo2c.lua TOPOLOGY.json OUT.c [NAME]
--   lua5.4 tests/runtime/topo2c.lua TOPOLOGY.json OUT.c [NAME]     (same, without the generator)
-- Reads {"world": W, "groups": {"tp": [[0,1],[2,3]], ...}, ...} (the generator's topology.json;
-- a group may also be an object with a "ranks" array) or the `build/gen ... --dump topology`
-- form {"world": W, "kinds": [{"name": "tp", "size": 2, "count": 4, "members": [...]}, ...]}
-- (members group-major), which the generator prints also for layouts it cannot yet train. Uses gen/lua/json.lua (json.decode) when it can be required, else the
-- small decoder below. Kinds are emitted in sorted order; the row order inside a group is kept
-- (it defines the group rank).
local args = arg or { ... }
local inpath, outpath, name = args[1], args[2], args[3]
if not inpath or not outpath then
    io.stderr:write("usage: topo2c.lua TOPOLOGY.json OUT.c [NAME]\n")
    os.exit(2)
end

-- -- JSON ------------------------------------------------------------------------------------
local function tiny_decode(s)
    local pos = 1
    local function fail(msg)
        error(string.format("%s: JSON error at byte %d: %s", inpath, pos, msg), 0)
    end
    local function ws()
        pos = s:find("[^ \t\r\n]", pos) or #s + 1
    end
    local value
    local function str()
        local out, i = {}, pos + 1
        while true do
            local c = s:sub(i, i)
            if c == "" then fail("unterminated string") end
            if c == '"' then break end
            if c == "\\" then
                local e = s:sub(i + 1, i + 1)
                local map = { b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }
                if e == "u" then
                    local cp = tonumber(s:sub(i + 2, i + 5), 16) or fail("bad \\u escape")
                    out[#out + 1] = utf8.char(cp)
                    i = i + 6
                else
                    out[#out + 1] = map[e] or e
                    i = i + 2
                end
            else
                out[#out + 1] = c
                i = i + 1
            end
        end
        pos = i + 1
        return table.concat(out)
    end
    function value()
        ws()
        local c = s:sub(pos, pos)
        if c == "{" then
            local t = {}
            pos = pos + 1
            ws()
            if s:sub(pos, pos) == "}" then pos = pos + 1 return t end
            while true do
                ws()
                if s:sub(pos, pos) ~= '"' then fail("expected a key") end
                local k = str()
                ws()
                if s:sub(pos, pos) ~= ":" then fail("expected ':'") end
                pos = pos + 1
                t[k] = value()
                ws()
                local d = s:sub(pos, pos)
                pos = pos + 1
                if d == "}" then return t end
                if d ~= "," then fail("expected ',' or '}'") end
            end
        elseif c == "[" then
            local t = {}
            pos = pos + 1
            ws()
            if s:sub(pos, pos) == "]" then pos = pos + 1 return t end
            while true do
                t[#t + 1] = value()
                ws()
                local d = s:sub(pos, pos)
                pos = pos + 1
                if d == "]" then return t end
                if d ~= "," then fail("expected ',' or ']'") end
            end
        elseif c == '"' then
            return str()
        elseif s:sub(pos, pos + 3) == "true" then
            pos = pos + 4 return true
        elseif s:sub(pos, pos + 4) == "false" then
            pos = pos + 5 return false
        elseif s:sub(pos, pos + 3) == "null" then
            pos = pos + 4 return nil
        else
            local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
            if not num or num == "" then fail("unexpected character '" .. c .. "'") end
            pos = pos + #num
            return math.tointeger(tonumber(num)) or tonumber(num)
        end
    end
    local v = value()
    ws()
    if pos <= #s then fail("trailing characters") end
    return v
end

local f = assert(io.open(inpath, "rb"))
local text = f:read("a")
f:close()
package.path = "gen/lua/?.lua;" .. package.path
local ok, json = pcall(require, "json")
local topo
if ok and type(json) == "table" and json.decode then
    topo = json.decode(text)
else
    topo = tiny_decode(text)
end

-- -- Tables ----------------------------------------------------------------------------------
local function die(msg)
    io.stderr:write(inpath .. ": error: " .. msg .. "\n")
    os.exit(1)
end

local world = math.tointeger(topo.world) or die("no integer 'world'")
local groups = topo.groups
if type(groups) ~= "table" and type(topo.kinds) == "table" then
    groups = {}
    for _, k in ipairs(topo.kinds) do
        local size, count = math.tointeger(k.size), math.tointeger(k.count)
        if not (k.name and size and count and type(k.members) == "table") then
            die("a kind without name, size, count and members")
        end
        if #k.members ~= size * count then
            die(string.format("kind %s: %d members for %d groups of %d", k.name, #k.members,
                              count, size))
        end
        local rows = {}
        for g = 0, count - 1 do
            rows[#rows + 1] = table.move(k.members, g * size + 1, (g + 1) * size, 1, {})
        end
        groups[k.name] = rows
    end
end
if type(groups) ~= "table" then die("no 'groups' object or 'kinds' array") end
local kinds = {}
for k in pairs(groups) do kinds[#kinds + 1] = k end
table.sort(kinds)
if not name then
    name = inpath:match("([^/]+)/[^/]*$") or "generated"
end

local out = {
    "/* Generated by tests/runtime/topo2c.lua from " .. inpath .. " -- DO NOT EDIT. */",
    '#include "t_tables.h"',
    "#include <stddef.h>",
    "",
}
local entries = {}
for ki, kind in ipairs(kinds) do
    local rows, size = {}, nil
    for gi, grp in ipairs(groups[kind]) do
        local r = type(grp) == "table" and (grp.ranks or grp) or die(kind .. ": bad group")
        size = size or #r
        if #r ~= size then
            die(string.format("%s: group %d has %d ranks, group 1 has %d", kind, gi, #r, size))
        end
        for _, x in ipairs(r) do
            if math.type(x) ~= "integer" then die(kind .. ": non-integer rank") end
        end
        rows[#rows + 1] = table.concat(r, ", ")
    end
    local var = "k" .. ki
    if #rows > 0 then
        out[#out + 1] = string.format("static const int %s[] = { %s };", var,
                                      table.concat(rows, ",  "))
        entries[#entries + 1] = string.format('    { "%s", %d, %d, %s },', kind, #rows, size, var)
    else
        entries[#entries + 1] = string.format('    { "%s", 0, 1, NULL },', kind)
    end
end
out[#out + 1] = "static const t_table tables[] = {"
for _, e in ipairs(entries) do out[#out + 1] = e end
out[#out + 1] = "};"
out[#out + 1] = string.format('const t_config t_configs[] = { { "%s", %d, %d, tables } };',
                              name, world, #entries)
out[#out + 1] = "const int t_nconfigs = 1;"
out[#out + 1] = ""

local o = assert(io.open(outpath, "wb"))
o:write(table.concat(out, "\n"))
o:close()
