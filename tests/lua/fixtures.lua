-- tests/lua/fixtures.lua: build configurations for tests from a few fields, through the real
-- model loader (the source text is generated and run in the sandbox like a model file).
--   local F = require("fixtures")
--   local cfg, topo, part, sh = F.build({ layers = 8, heads = 8, moe = { experts = 8 } },
--                                       { tp = 2, pp = 2, dp = 2 })

local config = require("config")
local partition = require("partition")
local program = require("program")
local schedule = require("schedule")
local shards = require("shards")
local topology = require("topology")
local util = require("util")

local F = {}

F.DEFAULTS = { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }

local function literal(v)
    if type(v) == "string" then return string.format("%q", v) end
    return tostring(v)
end

-- Model source for 'fields' (missing required fields from F.DEFAULTS); 'moe' may be a table
-- of moe{} fields.
function F.source(fields)
    local all = {}
    for k, v in pairs(F.DEFAULTS) do all[k] = v end
    for k, v in pairs(fields or {}) do all[k] = v end
    local lines = { "return gpt {" }
    for k, v in util.sortedpairs(all) do
        if k == "moe" then
            local inner = {}
            for mk, mv in util.sortedpairs(v) do inner[#inner + 1] = mk .. " = " .. literal(mv) end
            lines[#lines + 1] = "    moe = moe { " .. table.concat(inner, ", ") .. " },"
        else
            lines[#lines + 1] = "    " .. k .. " = " .. literal(v) .. ","
        end
    end
    lines[#lines + 1] = "}"
    return table.concat(lines, "\n") .. "\n"
end

function F.model(fields)
    return config.model_from_source(F.source(fields), "test.lua", "test")
end

function F.config(fields, opts)
    return config.configure(F.model(fields), opts or {})
end

-- cfg, topo, part, sh, sched, prog for a model and sizes (prog nil for a layout the training
-- programs do not support).
function F.build(fields, opts)
    local cfg = F.config(fields, opts)
    local topo = topology.build(cfg)
    local part = partition.build(cfg, topo)
    local sh = shards.build(cfg, topo, part)
    local sched = schedule.build(cfg.pp, cfg.vp, cfg.nmb, cfg.mb_group)
    local prog = program.supported(cfg) and program.build(cfg, topo, part, sh, sched) or nil
    return cfg, topo, part, sh, sched, prog
end

-- Groups of kind 'name' as a list of lists.
function F.groups(topo, name)
    local kind = topology.kind(topo, name)
    local out = {}
    for g = 0, kind.count - 1 do out[g + 1] = topology.members(kind, g) end
    return out
end

return F
