-- tests/lua/topology_test.lua: Megatron's rank groups. The worked examples of
-- docs/megatron.md §1.6, group for group; then structural properties over
-- random valid configurations (world up to 4096, random orders Megatron accepts).
-- Run: build/gen --lua tests/lua/topology_test.lua

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
require("strict")
local T = require("harness")("topology")
local F = require("fixtures")
local config = require("config")
local diag = require("diag")
local topology = require("topology")

local G = F.groups

local function range(a, b)
    local out = {}
    for i = a, b do out[#out + 1] = i end
    return out
end

local function singletons(n)
    local out = {}
    for i = 0, n - 1 do out[i + 1] = { i } end
    return out
end

local DENSE = { layers = 8, hidden = 64, heads = 8 }
local MOE = { layers = 8, hidden = 64, heads = 8, add_bias_linear = false,
              moe = { experts = 8, top_k = 2 } }

-- -- Worked examples -----------------------------------------------------------------------------

T.test("example B: dense TP4-PP2-DP2", function()
    local _, topo = F.build(DENSE, { tp = 4, pp = 2, dp = 2 })
    T.eq(G(topo, "tp"), { range(0, 3), range(4, 7), range(8, 11), range(12, 15) }, "tp")
    T.eq(G(topo, "dp"), { { 0, 4 }, { 1, 5 }, { 2, 6 }, { 3, 7 }, { 8, 12 }, { 9, 13 },
                          { 10, 14 }, { 11, 15 } }, "dp")
    T.eq(G(topo, "pp"), { { 0, 8 }, { 1, 9 }, { 2, 10 }, { 3, 11 }, { 4, 12 }, { 5, 13 },
                          { 6, 14 }, { 7, 15 } }, "pp")
    -- global_rank = tp_rank + dp_rank * tp_size + pp_rank * tp_size * dp_size
    for r = 0, 15 do
        local c = topology.coords(topo, r)
        T.eq(c.tp + c.dp * 4 + c.pp * 8, r, "rank formula")
    end
end)

T.test("example C: MoE folding ETP1-PP2-EP4-EDP2", function()
    local cfg, topo = F.build(MOE, { tp = 4, pp = 2, dp = 2, ep = 4, etp = 1, sp = true })
    T.eq(cfg.edp, 2, "edp")
    T.eq(G(topo, "ep"), { range(0, 3), range(4, 7), range(8, 11), range(12, 15) }, "ep")
    T.eq(G(topo, "expt-dp"), { { 0, 4 }, { 1, 5 }, { 2, 6 }, { 3, 7 }, { 8, 12 }, { 9, 13 },
                               { 10, 14 }, { 11, 15 } }, "edp")
    T.eq(G(topo, "expt-tp"), singletons(16), "etp")
    T.eq(G(topo, "pp"), { { 0, 8 }, { 1, 9 }, { 2, 10 }, { 3, 11 }, { 4, 12 }, { 5, 13 },
                          { 6, 14 }, { 7, 15 } }, "pp")
    -- global_rank = etp_rank + ep_rank * etp_size + edp_rank * etp_size * ep_size + pp * 8
    for r = 0, 15 do
        local c = topology.coords(topo, r)
        T.eq(c.etp + c.ep * 1 + c.edp * 4 + c.pp * 8, r, "expert rank formula")
    end
end)

T.test("example A: TP2 PP4 on 16", function()
    local _, topo = F.build(DENSE, { tp = 2, pp = 4, dp = 2 })
    T.eq(G(topo, "tp"), { { 0, 1 }, { 2, 3 }, { 4, 5 }, { 6, 7 }, { 8, 9 }, { 10, 11 },
                          { 12, 13 }, { 14, 15 } }, "tp")
    T.eq(G(topo, "pp"), { { 0, 4, 8, 12 }, { 1, 5, 9, 13 }, { 2, 6, 10, 14 },
                          { 3, 7, 11, 15 } }, "pp")
    local dp = { { 0, 2 }, { 1, 3 }, { 4, 6 }, { 5, 7 }, { 8, 10 }, { 9, 11 }, { 12, 14 },
                 { 13, 15 } }
    T.eq(G(topo, "dp"), dp, "dp")
    T.eq(G(topo, "cp"), singletons(16), "cp")
    T.eq(G(topo, "dp-cp"), dp, "dp-cp")
    local mp = { { 0, 1, 4, 5, 8, 9, 12, 13 }, { 2, 3, 6, 7, 10, 11, 14, 15 } }
    T.eq(G(topo, "mp"), mp, "mp")
    local tpdp = { range(0, 3), range(4, 7), range(8, 11), range(12, 15) }
    T.eq(G(topo, "tp-dp"), tpdp, "tp-dp")
    T.eq(G(topo, "tp-dp-cp"), tpdp, "tp-dp-cp")
    T.eq(G(topo, "tp-cp"), G(topo, "tp"), "tp-cp")
    T.eq(G(topo, "ep"), singletons(16), "ep")
    T.eq(G(topo, "expt-tp"), G(topo, "tp"), "expt-tp")
    T.eq(G(topo, "expt-dp"), dp, "expt-dp")
    T.eq(G(topo, "tp-ep"), G(topo, "tp"), "tp-ep")
    T.eq(G(topo, "tp-ep-pp"), mp, "tp-ep-pp")
    T.eq(G(topo, "embd"), { { 0, 12 }, { 1, 13 }, { 2, 14 }, { 3, 15 } }, "embd")
    T.eq(G(topo, "pos-embd"), { { 0 }, { 1 }, { 2 }, { 3 } }, "pos-embd")
    -- example A: the pipeline of rank 2 is [2, 6, 10, 14]; neighbours wrap around.
    local prev, nxt = topology.neighbours(topo, 2)
    T.eq({ prev, nxt }, { 14, 6 }, "neighbours of 2")
    prev, nxt = topology.neighbours(topo, 14)
    T.eq({ prev, nxt }, { 10, 2 }, "neighbours of 14")
end)

T.test("example B: TP4 PP2 on 16", function()
    local _, topo = F.build(DENSE, { tp = 4, pp = 2, dp = 2 })
    local pp = { { 0, 8 }, { 1, 9 }, { 2, 10 }, { 3, 11 }, { 4, 12 }, { 5, 13 }, { 6, 14 },
                 { 7, 15 } }
    local dp = { { 0, 4 }, { 1, 5 }, { 2, 6 }, { 3, 7 }, { 8, 12 }, { 9, 13 }, { 10, 14 },
                 { 11, 15 } }
    local mp = { { 0, 1, 2, 3, 8, 9, 10, 11 }, { 4, 5, 6, 7, 12, 13, 14, 15 } }
    T.eq(G(topo, "tp"), { range(0, 3), range(4, 7), range(8, 11), range(12, 15) }, "tp")
    T.eq(G(topo, "pp"), pp, "pp")
    T.eq(G(topo, "dp"), dp, "dp")
    T.eq(G(topo, "dp-cp"), dp, "dp-cp")
    T.eq(G(topo, "mp"), mp, "mp")
    T.eq(G(topo, "tp-dp"), { range(0, 7), range(8, 15) }, "tp-dp")
    T.eq(G(topo, "tp-dp-cp"), { range(0, 7), range(8, 15) }, "tp-dp-cp")
    T.eq(G(topo, "tp-cp"), G(topo, "tp"), "tp-cp")
    T.eq(G(topo, "ep"), singletons(16), "ep")
    T.eq(G(topo, "expt-tp"), G(topo, "tp"), "expt-tp")
    T.eq(G(topo, "expt-dp"), dp, "expt-dp")
    T.eq(G(topo, "tp-ep"), G(topo, "tp"), "tp-ep")
    T.eq(G(topo, "tp-ep-pp"), mp, "tp-ep-pp")
    T.eq(G(topo, "embd"), pp, "embd")
    T.eq(G(topo, "pos-embd"), singletons(8), "pos-embd")
end)

T.test("example C: TP4 PP2 ETP1 EP4 (MoE folding)", function()
    local cfg, topo = F.build(MOE, { tp = 4, pp = 2, dp = 2, ep = 4, etp = 1, sp = true })
    T.eq({ cfg.dp, cfg.edp }, { 2, 2 }, "D, De")
    local quads = { range(0, 3), range(4, 7), range(8, 11), range(12, 15) }
    local pp = { { 0, 8 }, { 1, 9 }, { 2, 10 }, { 3, 11 }, { 4, 12 }, { 5, 13 }, { 6, 14 },
                 { 7, 15 } }
    T.eq(G(topo, "tp"), quads, "tp (as example B)")
    T.eq(G(topo, "dp"), { { 0, 4 }, { 1, 5 }, { 2, 6 }, { 3, 7 }, { 8, 12 }, { 9, 13 },
                          { 10, 14 }, { 11, 15 } }, "dp (as example B)")
    T.eq(G(topo, "ep"), quads, "ep = the attention TP groups")
    T.eq(G(topo, "expt-tp"), singletons(16), "expt-tp")
    T.eq(G(topo, "expt-dp"), { { 0, 4 }, { 1, 5 }, { 2, 6 }, { 3, 7 }, { 8, 12 }, { 9, 13 },
                               { 10, 14 }, { 11, 15 } }, "expt-dp")
    T.eq(G(topo, "tp-ep"), quads, "tp-ep")
    T.eq(G(topo, "tp-ep-pp"), { { 0, 1, 2, 3, 8, 9, 10, 11 }, { 4, 5, 6, 7, 12, 13, 14, 15 } },
         "tp-ep-pp")
    T.eq(G(topo, "pp"), pp, "pp")
    T.eq(G(topo, "embd"), pp, "embd")
end)

T.test("bonus: TP2 CP2 PP2, then EP4 ETP1", function()
    local _, topo = F.build(DENSE, { tp = 2, cp = 2, pp = 2, dp = 2 })
    T.eq(G(topo, "cp"), { { 0, 2 }, { 1, 3 }, { 4, 6 }, { 5, 7 }, { 8, 10 }, { 9, 11 },
                          { 12, 14 }, { 13, 15 } }, "cp")
    T.eq(G(topo, "dp"), { { 0, 4 }, { 1, 5 }, { 2, 6 }, { 3, 7 }, { 8, 12 }, { 9, 13 },
                          { 10, 14 }, { 11, 15 } }, "dp")
    T.eq(G(topo, "dp-cp"), { { 0, 2, 4, 6 }, { 1, 3, 5, 7 }, { 8, 10, 12, 14 },
                             { 9, 11, 13, 15 } }, "dp-cp")
    T.eq(G(topo, "tp-cp"), { range(0, 3), range(4, 7), range(8, 11), range(12, 15) }, "tp-cp")
    T.eq(G(topo, "pp"), { { 0, 8 }, { 1, 9 }, { 2, 10 }, { 3, 11 }, { 4, 12 }, { 5, 13 },
                          { 6, 14 }, { 7, 15 } }, "pp")
    local _, topo2 = F.build(MOE, { tp = 2, cp = 2, pp = 2, dp = 2, ep = 4, etp = 1,
                                      sp = true })
    T.eq(G(topo2, "ep"), { range(0, 3), range(4, 7), range(8, 11), range(12, 15) },
         "ep folded over TP x CP")
    -- rank = t + T*c + T*C*d + T*C*D*p (docs/megatron.md §1.3)
    for r = 0, 15 do
        local c = topology.coords(topo, r)
        T.eq(c.tp + 2 * c.cp + 4 * c.dp + 8 * c.pp, r, "dense rank formula")
    end
end)

T.test("1.6 error examples", function()
    T.raises("is not divisible by ETP*EP*PP = 2*3*2 = 12", F.config, MOE,
             { tp = 2, pp = 2, dp = 4, ep = 3 })
    T.raises("EDP = 2 must equal DP = 4", F.config, MOE,
             { tp = 2, pp = 2, dp = 4, ep = 2, order = "tp-ep-pp-dp" })
end)

T.test("orders that name every axis give the same groups", function()
    -- Axes of size 1 may be left out of ORDER (Megatron appends them).
    local _, a = F.build(DENSE, { tp = 2, pp = 2, dp = 2 })
    local _, b = F.build(DENSE, { tp = 2, pp = 2, dp = 2, order = "tp-dp-pp" })
    for _, kind in ipairs(topology.KINDS) do
        T.eq(G(a, kind[1]), G(b, kind[1]), kind[1])
    end
    -- A different order moves the ranks: dp fastest.
    local _, c = F.build(DENSE, { tp = 2, pp = 2, dp = 2, order = "dp-tp-pp" })
    T.eq(G(c, "dp"), { { 0, 1 }, { 2, 3 }, { 4, 5 }, { 6, 7 } }, "dp with dp-tp-pp")
    T.eq(G(c, "tp"), { { 0, 2 }, { 1, 3 }, { 4, 6 }, { 5, 7 } }, "tp with dp-tp-pp")
end)

-- -- Structural properties over random configurations ----------------------------------------

local AXES = { "tp", "cp", "ep", "dp", "pp" }

-- Check every property of 'topo' built from 'cfg'; errors name the broken one.
local function check(cfg, topo)
    local W = cfg.world
    T.eq(W, cfg.tp * cfg.cp * cfg.dp * cfg.pp, "world = T*C*D*P")
    T.eq(W, cfg.etp * cfg.ep * cfg.edp * cfg.pp, "world = Te*E*De*P")
    -- coordinates <-> rank
    for r = 0, W - 1 do
        local c = topology.coords(topo, r)
        T.eq(topology.rank_of(topo.dense, { tp = c.tp, cp = c.cp, dp = c.dp, pp = c.pp }), r,
             "dense round trip")
        T.eq(topology.rank_of(topo.expert, { tp = c.etp, ep = c.ep, dp = c.edp, pp = c.pp }), r,
             "expert round trip")
        T.ok(c.tp < cfg.tp and c.cp < cfg.cp and c.dp < cfg.dp and c.pp < cfg.pp and
             c.etp < cfg.etp and c.ep < cfg.ep and c.edp < cfg.edp, "coordinates in range")
    end
    for _, kind in ipairs(topo.kinds) do
        if kind.grid ~= "pp" then
            local grid = topo[kind.grid]
            local members = topology.all_members(kind)
            T.eq(#members, W, kind.name .. ": members")
            T.eq(kind.size * kind.count, W, kind.name .. ": size*count")
            local seen = {}
            for g = 0, kind.count - 1 do
                local base = g * kind.size
                local key, gidx, gmul
                for j = 1, kind.size do
                    local r = members[base + j]
                    T.ok(r >= 0 and r < W and not seen[r], "%s: rank %d twice or out of range",
                         kind.name, r)
                    seen[r] = true
                    if j > 1 then
                        T.ok(r > members[base + j - 1], "%s: group %d not ascending",
                             kind.name, g)
                    end
                    -- members agree on every unmasked axis; the group index is the mixed
                    -- radix of those coordinates, first unmasked axis fastest
                    local k2, idx, mul = {}, 0, 1
                    for i, a in ipairs(grid.axes) do
                        local c = topology.coord(grid, r, a)
                        if not kind.mask[i] then
                            k2[#k2 + 1] = c
                            idx, mul = idx + c * mul, mul * grid.sizes[i]
                        end
                    end
                    local k2s = table.concat(k2, ",")
                    T.ok(key == nil or key == k2s, "%s: group %d mixes unmasked coordinates",
                         kind.name, g)
                    key, gidx, gmul = k2s, idx, mul
                    local gg, pos = topology.group_of(topo, kind.name, r)
                    T.ok(gg == g and pos == j - 1, "%s: group_of(%d)", kind.name, r)
                end
                T.eq(gidx, g, kind.name .. ": group order")
                T.ok(gmul * kind.size == W, "%s: group size", kind.name)
            end
        end
    end
    -- the pipeline groups of both grids coincide (Megatron asserts it)
    local dpp = topology.masked_groups(W, topo.dense, "pp", "pp")
    local epp = topology.masked_groups(W, topo.expert, "pp", "pp")
    T.eq(topology.all_members(dpp), topology.all_members(epp), "dense and expert pp groups")
    -- embedding groups: first and last member of every pp group
    local pp, embd, pos = topology.kind(topo, "pp"), topology.kind(topo, "embd"),
                          topology.kind(topo, "pos-embd")
    for g = 0, pp.count - 1 do
        local members = topology.members(pp, g)
        local want = (cfg.pp > 1) and { members[1], members[#members] } or { members[1] }
        T.eq(topology.members(embd, g), want, "embd group")
        T.eq(topology.members(pos, g), { members[1] }, "pos-embd group")
        for i, r in ipairs(members) do
            T.eq(topology.coord(topo.dense, r, "pp"), i - 1, "pp group in stage order")
            local prev, nxt = topology.neighbours(topo, r)
            T.eq(prev, members[(i - 2) % #members + 1], "prev")
            T.eq(nxt, members[i % #members + 1], "next")
        end
    end
end

-- A random configuration: sizes with world <= 4096 and an order Megatron accepts (or not:
-- the caller skips rejected ones and counts them).
local function random_config(rnd)
    local pick = function(list) return list[rnd(1, #list)] end
    local s = { tp = pick({ 1, 1, 2, 2, 4, 8 }), cp = pick({ 1, 1, 1, 2, 4 }),
                dp = pick({ 1, 2, 3, 4, 8, 16 }), pp = pick({ 1, 2, 2, 3, 4, 8 }) }
    if s.tp * s.cp * s.dp * s.pp > 4096 then s.dp = 1 end
    local moe = rnd(1, 3) > 1
    local opts = { tp = s.tp, cp = s.cp, dp = s.dp, pp = s.pp }
    if moe then
        opts.ep = pick({ 1, 2, 2, 4, 8 })
        opts.etp = pick({ 1, 1, 2, s.tp })
        opts.sp = s.tp > 1 or nil    -- Megatron wants SP with EP and TP (else a warning)
    end
    -- order: a random permutation of the axes, size-1 axes sometimes left out
    local sizes = { tp = math.max(s.tp, opts.etp or 1), cp = s.cp, ep = opts.ep or 1,
                    dp = 2, pp = s.pp }
    local axes = {}
    for _, a in ipairs(AXES) do
        if sizes[a] > 1 or rnd(0, 1) == 1 then axes[#axes + 1] = a end
    end
    for i = #axes, 2, -1 do
        local j = rnd(1, i)
        axes[i], axes[j] = axes[j], axes[i]
    end
    if rnd(0, 2) > 0 and #axes > 0 then opts.order = table.concat(axes, "-") end
    local heads = s.tp * 2
    local model = { layers = s.pp * 2, hidden = heads * 4, heads = heads,
                    seq_len = 16 * s.cp * s.tp, vocab = 200 + rnd(0, 100) }
    if moe then model.add_bias_linear, model.moe = false, { experts = 8, top_k = 2 } end
    return model, opts
end

T.test("random configurations: groups, coordinates, embedding groups", function()
    local rnd = T.random(2)
    local accepted, rejected, orders = 0, 0, {}
    for _ = 1, 300 do
        local model, opts = random_config(rnd)
        local ok, cfg = pcall(F.config, model, opts)
        if ok then
            accepted = accepted + 1
            orders[cfg.order] = true
            check(cfg, topology.build(cfg))
        elseif diag.is_user_error(cfg) then
            rejected = rejected + 1
        else
            error(cfg, 0)
        end
    end
    local n = 0
    for _ in pairs(orders) do n = n + 1 end
    T.ok(accepted >= 150, "only %d of 300 random configurations were valid", accepted)
    T.ok(n >= 20, "only %d distinct orders were exercised", n)
end)

T.test("a 4096-rank world with every axis", function()
    local cfg, topo = F.build({ layers = 8, hidden = 64, heads = 8, seq_len = 64,
                                add_bias_linear = false, moe = { experts = 8, top_k = 2 } },
                              { tp = 4, cp = 2, dp = 64, pp = 8, ep = 8, etp = 2, sp = true })
    T.eq(cfg.world, 4096, "world")
    check(cfg, topo)
end)

T.test("default order is tp-cp-ep-dp-pp", function()
    T.eq(config.DEFAULT_ORDER, "tp-cp-ep-dp-pp", "default")
    local cfg = F.config(DENSE, { tp = 2 })
    T.eq(cfg.axes, { "tp", "cp", "ep", "dp", "pp" }, "axes")
    local cfg2 = F.config(DENSE, { tp = 2, order = "tp-dp-pp" })
    T.eq(cfg2.axes, { "tp", "dp", "pp", "ep", "cp" }, "missing axes appended in Megatron's order")
end)

T.done()
