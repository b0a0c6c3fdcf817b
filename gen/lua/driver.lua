-- driver.lua: the generator's pipeline; driver.run(opts) is the only Lua function the C host
-- calls (opts: the parsed command line, docs/DESIGN.md 4.1; absent options are nil).
--   cfg -> topology -> partition -> shards -> emit
-- Modes, at most one: --print-out (print the output directory), --dump PASS (a pass's result
-- as JSON), --check (validate only), --inspect [--rank R] (print a report); otherwise render
-- every file in memory and write out/<dir>/. Nothing is written unless every pass succeeded.

require("strict")

local config = require("config")
local diag = require("diag")
local emit = require("emit")
local inspect = require("inspect")
local ir = require("ir")
local json = require("json")
local partition = require("partition")
local program = require("program")
local shards = require("shards")
local topology = require("topology")

local M = {}

-- What --dump accepts, in --help order, with the number of passes each needs to run.
M.DUMPS = { { "config", 1 }, { "topology", 2 }, { "partition", 3 }, { "shards", 4 },
            { "schema", 0 } }

local MODES = { "print_out", "dump", "check", "inspect" }
local MODE_FLAG = { print_out = "--print-out", dump = "--dump", check = "--check",
                    inspect = "--inspect" }

-- Run the passes: stop after 'n' of config, topology, partition, shards.
function M.passes(opts, n)
    local r = {}
    r.config = config.load(opts)
    if n >= 2 then r.topology = topology.build(r.config) end
    if n >= 3 then r.partition = partition.build(r.config, r.topology) end
    if n >= 4 then r.shards = shards.build(r.config, r.topology, r.partition) end
    return r
end

function M.run(opts)
    assert(type(opts) == "table", "driver.run: opts must be a table")
    -- Rendering makes many short-lived strings; the generational collector keeps the peak
    -- near the live size (gpt3_175b at 65536 ranks: 100-120 MiB instead of 165 MiB).
    collectgarbage("generational")
    local modes = {}
    for _, m in ipairs(MODES) do
        if opts[m] then modes[#modes + 1] = MODE_FLAG[m] end
    end
    if #modes > 1 then
        diag.error(nil, "%s cannot be combined (choose one)", table.concat(modes, " and "))
    end

    if opts.dump ~= nil then
        local need, names = nil, {}
        for i, d in ipairs(M.DUMPS) do
            names[i] = d[1]
            if d[1] == opts.dump then need = d[2] end
        end
        if not need then
            diag.error(nil, "--dump %s: unknown pass (one of: %s)", tostring(opts.dump),
                       table.concat(names, ", "))
        end
        if opts.dump == "schema" then
            io.write(json.encode(ir.schema()))
            return
        end
        local r = M.passes(opts, need)
        io.write(json.encode(r[opts.dump]))
        return
    end
    if opts.print_out then
        local cfg = config.load(opts)
        io.write(cfg.outdir, "\n")
        return
    end

    local r = M.passes(opts, 4)
    local cfg, topo, part, sh = r.config, r.topology, r.partition, r.shards
    if opts.check then return end
    if opts.inspect then
        if opts.rank ~= nil then
            io.write(inspect.rank(cfg, topo, part, sh, opts.rank))
        else
            io.write(inspect.summary(cfg, topo, part, sh))
        end
        return
    end
    local prog = nil
    if not opts.topology_only then prog = program.build(cfg, topo, part, sh) end
    local files = emit.render(cfg, topo, part, sh, prog, { line_dirs = opts.line_dirs })
    emit.write(cfg.outdir, files)
    local names = {}
    for i, f in ipairs(files) do names[i] = f.name end
    io.write(string.format("gen: wrote %s/ (%s)\n", cfg.outdir, table.concat(names, " ")))
end

return M
