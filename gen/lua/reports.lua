-- reports.lua: the JSON reports of an output directory, as text (emit.lua writes them).
--
-- topology.json (format "topology/2"):
--   {"model": NAME, "world": W, "order": ORDER,                    <- one line: make run reads it
--    "format": "topology/2",
--    "sizes": {"tp", "cp", "dp", "pp", "ep", "etp", "edp", "vp"},
--    "grids": {"dense": {"axes": [...], "sizes": [...], "strides": [...]}, "expert": {...}},
--    "kinds": [{"name", "grid", "varying": [axes that vary inside a group], "size", "count"},
--              ...],                          embd/pos-embd: grid "pp", ends of each pp group
--    "listed": true | false,
--    "groups": {"tp": [[0,1],[2,3],...], ...},   <- only when listed (world <= LIST_MAX)
--    "ranks": [{"rank", "tp", "cp", "dp", "pp", "ep", "etp", "edp", "chunks", "embedding",
--               "head"}, ...]}                 <- only when listed
--   Rank r's coordinate on an axis is (r / stride) mod size; a kind's group of r holds the
--   ranks that agree with r on every axis not in "varying", in order of the varying axes
--   (the first fastest): make inspect RANK=r prints them for any world.
-- shards.json (format "shards/2"): the Shards record (ir.lua), one param, buffer or bytes
-- record per line, fields in their ir.lua order and with their ir.lua meanings:
--   {"format": "shards/2", "model": NAME, "world": W,
--    "dtypes": [Dtype, ...],
--    "unique": N, "unique_dense": N, "unique_expert": N, "held": N,
--    "class_of_rank": {"key": ["pp", "tp", "ep", "etp"], "grids": [...]},
--    "classes": [
--     {"id", "pp", "tp", "ep", "etp", "ranks", "first", "numel",
--      "params": [Param, ...],   pieces last: {"start": [..], "size": [..], "at": [..]}
--      "buffers": [Buffer, ...], with their Buckets and Slots
--      "bytes": [Bytes, ...]}, ...]}
--   A rank's class is the one with its (pp, tp, ep, etp) coordinates: pp and tp on the dense
--   grid, ep and tp on the expert grid (topology.json); dense models have ep = etp = 0.
-- Both are deterministic and, above LIST_MAX ranks, do not grow with the world. Pure.

local json = require("json")
local topology = require("topology")

local M = {}

M.TOPOLOGY_FORMAT = "topology/2"
M.SHARDS_FORMAT = "shards/2"
M.LIST_MAX = 4096       -- the groups and ranks of worlds up to this size are listed

local function bool(b) return b and "true" or "false" end

local function strings(list)
    local out = {}
    for i, v in ipairs(list) do out[i] = json.str(v) end
    return "[" .. table.concat(out, ", ") .. "]"
end

local function ints(list)
    return "[" .. table.concat(list, ", ") .. "]"
end

-- -- topology.json -------------------------------------------------------------------------------

-- The axes of 'kind' that vary inside its groups.
local function varying(topo, kind)
    if kind.grid == "pp" then return {} end
    local grid, out = topo[kind.grid], {}
    for i, a in ipairs(grid.axes) do
        if kind.mask[i] then out[#out + 1] = a end
    end
    return out
end

function M.topology_json(cfg, topo, part)
    local out = {}
    local s = topo.sizes
    local listed = topo.world <= M.LIST_MAX
    out[#out + 1] = string.format('{"model": %s, "world": %d, "order": %s,\n',
                                  json.str(cfg.model.name), topo.world, json.str(cfg.order))
    out[#out + 1] = string.format(' "format": %s,\n', json.str(M.TOPOLOGY_FORMAT))
    out[#out + 1] = string.format(' "sizes": {"tp": %d, "cp": %d, "dp": %d, "pp": %d, "ep": %d, ' ..
                                  '"etp": %d, "edp": %d, "vp": %d},\n',
                                  s.tp, s.cp, s.dp, s.pp, s.ep, s.etp, s.edp, s.vp)
    out[#out + 1] = ' "grids": {\n'
    for i, name in ipairs({ "dense", "expert" }) do
        local g = topo[name]
        out[#out + 1] = string.format('  %s: {"axes": %s, "sizes": %s, "strides": %s}%s\n',
                                      json.str(name), strings(g.axes), ints(g.sizes),
                                      ints(g.strides), i == 1 and "," or "")
    end
    out[#out + 1] = ' },\n "kinds": [\n'
    for i, kind in ipairs(topo.kinds) do
        out[#out + 1] = string.format('  {"name": %s, "grid": %s, "varying": %s, "size": %d, ' ..
                                      '"count": %d}%s\n', json.str(kind.name),
                                      json.str(kind.grid), strings(varying(topo, kind)),
                                      kind.size, kind.count, i < #topo.kinds and "," or "")
    end
    out[#out + 1] = string.format(' ],\n "listed": %s%s\n', bool(listed), listed and "," or "}")
    if not listed then return table.concat(out) end

    out[#out + 1] = ' "groups": {\n'
    for i, kind in ipairs(topo.kinds) do
        local groups = { "  " .. json.str(kind.name) .. ": [" }
        for g = 0, kind.count - 1 do
            groups[#groups + 1] = (g > 0 and ",[" or "[") ..
                                  table.concat(topology.members(kind, g), ",") .. "]"
        end
        groups[#groups + 1] = i < #topo.kinds and "],\n" or "]\n"
        out[#out + 1] = table.concat(groups)
    end
    out[#out + 1] = ' },\n "ranks": [\n'

    -- Per stage: the chunks text and duties.
    local stage_text = {}
    for _, st in ipairs(part.stages) do
        local chunks, emb, head = {}, false, false
        for i, c in ipairs(st.chunks) do
            local layers = {}
            for l = c.first, c.first + c.count - 1 do layers[#layers + 1] = l end
            chunks[i] = string.format('{"vp": %d, "layers": [%s]}', c.vp,
                                      table.concat(layers, ", "))
            emb, head = emb or c.embedding, head or c.head
        end
        stage_text[st.stage] = string.format('"chunks": [%s], "embedding": %s, "head": %s}',
                                             table.concat(chunks, ", "), bool(emb), bool(head))
    end
    local fmt = '  {"rank": %d, "tp": %d, "cp": %d, "dp": %d, "pp": %d, "ep": %d, "etp": %d, ' ..
                '"edp": %d, %s%s\n'
    local W = topo.world
    for r = 0, W - 1 do
        local c = topology.coords(topo, r)
        out[#out + 1] = string.format(fmt, r, c.tp, c.cp, c.dp, c.pp, c.ep, c.etp, c.edp,
                                      stage_text[c.pp], r < W - 1 and "," or "")
    end
    out[#out + 1] = " ]}\n"
    return table.concat(out)
end

-- -- shards.json ---------------------------------------------------------------------------------

function M.shards_json(cfg, sh)
    local out = {}
    local function list(records, indent)
        for i, rec in ipairs(records) do
            out[#out + 1] = indent .. json.line(rec) .. (i < #records and ",\n" or "\n")
        end
    end
    out[#out + 1] = string.format('{"format": %s, "model": %s, "world": %d,\n "dtypes": [\n',
                                  json.str(M.SHARDS_FORMAT), json.str(cfg.model.name), cfg.world)
    list(sh.dtypes, "  ")
    out[#out + 1] = string.format(' ],\n "unique": %d, "unique_dense": %d, "unique_expert": %d, ' ..
                                  '"held": %d,\n', sh.unique, sh.unique_dense, sh.unique_expert,
                                  sh.held)
    out[#out + 1] = ' "class_of_rank": {"key": ["pp", "tp", "ep", "etp"], "grids": ["dense", ' ..
                    '"dense", "expert", "expert"]},\n'
    out[#out + 1] = ' "classes": [\n'
    for ci, c in ipairs(sh.classes) do
        out[#out + 1] = string.format('  {"id": %d, "pp": %d, "tp": %d, "ep": %d, "etp": %d, ' ..
                                      '"ranks": %d, "first": %d, "numel": %d,\n   "params": [\n',
                                      c.id, c.pp, c.tp, c.ep, c.etp, c.ranks, c.first, c.numel)
        list(c.params, "    ")
        out[#out + 1] = '   ],\n   "buffers": [\n'
        list(c.buffers, "    ")
        out[#out + 1] = '   ],\n   "bytes": [\n'
        list(c.bytes, "    ")
        out[#out + 1] = "   ]}" .. (ci < #sh.classes and ",\n" or "\n")
    end
    out[#out + 1] = " ]}\n"
    return table.concat(out)
end

return M
