-- topology.lua: Megatron-LM's rank groups, exactly (docs/megatron.md §1).
-- topology.build(cfg) -> Topology: the dense grid (tp-cp-dp-pp) and the expert grid
-- (etp-ep-edp-pp) laid out in ORDER, every group kind as Megatron's
-- generate_masked_orthogonal_rank_groups makes it, plus the embedding and position-embedding
-- groups. Scale-free: a kind is held in closed form (the sizes and strides of the axes that
-- vary inside a group and of those that number the groups), never as member lists, so the
-- cost does not grow with the world; topology.members gives one group's members,
-- topology.group_of a rank's group, topology.stage_ranks_text a stage's ranks, each in time
-- proportional to what it returns. Pure; called by driver.lua and the tests.

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
-- (first one fastest); the others enumerate the groups (first one fastest). Held in closed form:
-- msizes/mstrides of the varying axes, usizes/ustrides of the others.
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
    return ir.GroupKind { name = name, grid = grid.name, token = token, mask = mask,
                          size = size, count = world // size, msizes = msz, mstrides = mst,
                          usizes = usz, ustrides = ust }
end

-- Embedding groups (first and last stage of each pipeline group; the first alone when P is 1)
-- and position-embedding groups (first stage), one per pipeline group, in pp-group order.
local function embedding_groups(pp, name, both_ends)
    local P = pp.size
    local size = (both_ends and P > 1) and 2 or 1
    return ir.GroupKind { name = name, grid = "pp", token = "", mask = {}, size = size,
                          count = pp.count, msizes = pp.msizes, mstrides = pp.mstrides,
                          usizes = pp.usizes, ustrides = pp.ustrides }
end

-- Rank at mixed-radix index 'x' over (sizes, strides), first axis fastest.
local function radix(x, sizes, strides)
    local r = 0
    for k = 1, #sizes do
        r = r + (x % sizes[k]) * strides[k]
        x = x // sizes[k]
    end
    return r
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

-- Members of group 'g' (0-based) of 'kind', in group-rank order, as a new array.
function M.members(kind, g)
    local base = radix(g, kind.usizes, kind.ustrides)
    if kind.grid == "pp" then     -- embd, pos-embd: ends of the pipeline group g
        local P, s = kind.msizes[1] or 1, kind.mstrides[1] or 1
        if kind.size == 2 then return { base, base + (P - 1) * s } end
        return { base }
    end
    local out = {}
    for j = 0, kind.size - 1 do out[j + 1] = base + radix(j, kind.msizes, kind.mstrides) end
    return out
end

-- Every group's members, group-major (small worlds: tests, explicit reports).
function M.all_members(kind)
    local out = {}
    for g = 0, kind.count - 1 do
        for _, r in ipairs(M.members(kind, g)) do out[#out + 1] = r end
    end
    return out
end

-- Pipeline neighbours of rank 'r' (Megatron wraps around): prev, next.
function M.neighbours(topo, r)
    local P = topo.sizes.pp
    local s = M.axis_stride(topo.dense, "pp")
    local p = M.coord(topo.dense, r, "pp")
    return r + ((p - 1) % P - p) * s, r + ((p + 1) % P - p) * s
end

-- Rank stride of 'axis' in 'grid'.
function M.axis_stride(grid, axis)
    for i, a in ipairs(grid.axes) do
        if a == axis then return grid.strides[i] end
    end
    error("topology: no axis " .. tostring(axis), 2)
end

M.LIST_MAX = 4096       -- up to this many ranks, stage rank lists are built and compressed

-- The ranks that run pipeline stage 'k', as util.ranks writes their sorted list ("0-3",
-- "1,3,5,7", "0-7,64-71,...,1984-1991"): the ranks whose pp coordinate is k, blocks of
-- 'stride' ranks every stride*P ranks. Above LIST_MAX ranks the text is computed from that
-- structure without building the list.
function M.stage_ranks_text(topo, k, width)
    local P, W = topo.sizes.pp, topo.world
    local s = M.axis_stride(topo.dense, "pp")
    if W <= M.LIST_MAX then
        local list = {}
        for r = 0, W - 1 do
            if (r // s) % P == k then list[#list + 1] = r end
        end
        return util.ranks(list, 1, #list, width)
    end
    local blocks, period = W // (s * P), s * P
    local function block(b)
        local a = k * s + b * period
        return s == 1 and string.format("%d", a) or string.format("%d-%d", a, a + s - 1)
    end
    if blocks == 1 then return block(0) end
    if s == 1 then
        return string.format("%d-%d step %d", k, k + (blocks - 1) * period, period)
    end
    if blocks >= 4 then return block(0) .. "," .. block(1) .. ",...," .. block(blocks - 1) end
    local out = {}
    for b = 0, blocks - 1 do out[#out + 1] = block(b) end
    return table.concat(out, ",")
end

-- The number of ranks that run stage k: world / PP.
function M.stage_size(topo)
    return topo.world // topo.sizes.pp
end

return M
