-- topology.lua: Megatron-LM's rank groups, exactly (megatron-semantics.md 1).
-- topology.build(cfg) -> Topology: the dense grid (tp-cp-dp-pp) and the expert grid
-- (etp-ep-edp-pp) laid out in ORDER, every group kind as Megatron's
-- generate_masked_orthogonal_rank_groups makes it, plus the embedding and position-embedding
-- groups. Groups are flat integer arrays (memory linear in the world, no per-rank tables), so
-- a 65536-rank world takes well under a second. Pure; called by driver.lua and the tests.

local ir = require("ir")
local util = require("util")

local M = {}

-- ORDER KINDS: the group kinds, in topology.json order: name, grid, Megatron token.
M.KINDS = {
    { "tp",       "dense",  "tp" },
    { "pp",       "dense",  "pp" },
    { "dp",       "dense",  "dp" },
    { "cp",       "dense",  "cp" },
    { "dp-cp",    "dense",  "dp-cp" },
    { "mp",       "dense",  "tp-pp" },
    { "tp-dp",    "dense",  "tp-dp" },
    { "tp-dp-cp", "dense",  "tp-dp-cp" },
    { "tp-cp",    "dense",  "tp-cp" },
    { "ep",       "expert", "ep" },
    { "expt-tp",  "expert", "tp" },
    { "expt-dp",  "expert", "dp" },
    { "tp-ep",    "expert", "tp-ep" },
    { "tp-ep-pp", "expert", "tp-ep-pp" },
    { "embd",     "pp",     "" },
    { "pos-embd", "pp",     "" },
}

-- A grid: 'axes' in rank order (fastest first) with the sizes in 'by_name'.
function M.grid(name, axes, by_name)
    local sizes, strides, s = {}, {}, 1
    for i, a in ipairs(axes) do
        sizes[i], strides[i] = by_name[a], s
        s = s * by_name[a]
    end
    return ir.Grid { name = name, axes = util.copy(axes), sizes = sizes, strides = strides }
end

-- generate_masked_orthogonal_rank_groups: the axes named in 'token' vary inside a group
-- (first one fastest); the others enumerate the groups (first one fastest).
function M.masked_groups(world, grid, token, name)
    local want = {}
    for part in token:gmatch("[^-]+") do want[part] = true end
    local mask, msz, mst, usz, ust = {}, {}, {}, {}, {}
    for i, a in ipairs(grid.axes) do
        mask[i] = want[a] == true
        if mask[i] then
            msz[#msz + 1], mst[#mst + 1] = grid.sizes[i], grid.strides[i]
        else
            usz[#usz + 1], ust[#ust + 1] = grid.sizes[i], grid.strides[i]
        end
    end
    local size = util.product(msz)
    local count = world // size
    local offsets = {}
    for j = 0, size - 1 do
        local rem, off = j, 0
        for k = 1, #msz do
            off = off + (rem % msz[k]) * mst[k]
            rem = rem // msz[k]
        end
        offsets[j + 1] = off
    end
    local members, n = {}, 0
    for g = 0, count - 1 do
        local rem, base = g, 0
        for k = 1, #usz do
            base = base + (rem % usz[k]) * ust[k]
            rem = rem // usz[k]
        end
        for j = 1, size do
            n = n + 1
            members[n] = base + offsets[j]
        end
    end
    return ir.GroupKind { name = name, grid = grid.name, token = token, mask = mask,
                          size = size, count = count, members = members }
end

-- Embedding groups (first and last stage of each pipeline group; the first alone when P is 1)
-- and position-embedding groups (first stage), one per pipeline group, in pp-group order.
local function embedding_groups(pp, name, both_ends)
    local P, members = pp.size, {}
    local size = (both_ends and P > 1) and 2 or 1
    for g = 0, pp.count - 1 do
        members[#members + 1] = pp.members[g * P + 1]
        if size == 2 then members[#members + 1] = pp.members[g * P + P] end
    end
    return ir.GroupKind { name = name, grid = "pp", token = "", mask = {}, size = size,
                          count = pp.count, members = members }
end

function M.build(cfg)
    local world = cfg.world
    local dense = M.grid("dense", cfg.axes, { tp = cfg.tp, cp = cfg.cp, ep = 1, dp = cfg.dp,
                                              pp = cfg.pp })
    local expert = M.grid("expert", cfg.axes, { tp = cfg.etp, cp = 1, ep = cfg.ep,
                                                dp = cfg.edp, pp = cfg.pp })
    local grids = { dense = dense, expert = expert }
    local kinds, index = {}, {}
    for i, k in ipairs(M.KINDS) do
        local name, gridname, token = k[1], k[2], k[3]
        if gridname == "pp" then
            kinds[i] = embedding_groups(kinds[index.pp], name, name == "embd")
        else
            kinds[i] = M.masked_groups(world, grids[gridname], token, name)
        end
        index[name] = i
    end
    return ir.Topology {
        world = world, order = cfg.order,
        sizes = { tp = cfg.tp, cp = cfg.cp, dp = cfg.dp, pp = cfg.pp, ep = cfg.ep,
                  etp = cfg.etp, edp = cfg.edp, vp = cfg.vp },
        dense = dense, expert = expert, kinds = kinds, index = index,
    }
end

-- -- Queries -----------------------------------------------------------------------------------

-- Coordinate of rank 'r' on the grid axis named 'axis'.
function M.coord(grid, r, axis)
    for i, a in ipairs(grid.axes) do
        if a == axis then return (r // grid.strides[i]) % grid.sizes[i] end
    end
    error("topology: no axis " .. tostring(axis), 2)
end

-- All coordinates of rank 'r': tp cp dp pp (dense grid), etp ep edp (expert grid).
function M.coords(topo, r)
    local d, e = topo.dense, topo.expert
    return {
        tp = M.coord(d, r, "tp"), cp = M.coord(d, r, "cp"), dp = M.coord(d, r, "dp"),
        pp = M.coord(d, r, "pp"), etp = M.coord(e, r, "tp"), ep = M.coord(e, r, "ep"),
        edp = M.coord(e, r, "dp"),
    }
end

-- The rank at coordinates 'c' (axis name -> coordinate, missing = 0) of 'grid'.
function M.rank_of(grid, c)
    local r = 0
    for i, a in ipairs(grid.axes) do r = r + (c[a] or 0) * grid.strides[i] end
    return r
end

function M.kind(topo, name)
    local i = topo.index[name]
    if not i then error("topology: no group kind " .. tostring(name), 2) end
    return topo.kinds[i]
end

-- Group index and position (both 0-based) of rank 'r' in kind 'name', or nil when the rank is
-- in no group of that kind (embd on a middle stage, pos-embd off the first stage).
function M.group_of(topo, name, r)
    local kind = M.kind(topo, name)
    if kind.grid == "pp" then
        local P = topo.sizes.pp
        local g, p = M.group_of(topo, "pp", r)
        if p == 0 then return g, 0 end
        if name == "embd" and P > 1 and p == P - 1 then return g, 1 end
        return nil
    end
    local grid = topo[kind.grid]
    local g, gmul, pos, pmul = 0, 1, 0, 1
    for i = 1, #grid.axes do
        local c = (r // grid.strides[i]) % grid.sizes[i]
        if kind.mask[i] then
            pos, pmul = pos + c * pmul, pmul * grid.sizes[i]
        else
            g, gmul = g + c * gmul, gmul * grid.sizes[i]
        end
    end
    return g, pos
end

-- Members of group 'g' (0-based) of 'kind', as a new array.
function M.members(kind, g)
    return table.move(kind.members, g * kind.size + 1, (g + 1) * kind.size, 1, {})
end

-- Pipeline neighbours of rank 'r' (Megatron wraps around): prev, next.
function M.neighbours(topo, r)
    local pp = M.kind(topo, "pp")
    local g, p = M.group_of(topo, "pp", r)
    local P = pp.size
    return pp.members[g * P + (p - 1) % P + 1], pp.members[g * P + (p + 1) % P + 1]
end

return M
