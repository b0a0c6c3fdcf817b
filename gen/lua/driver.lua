-- driver.lua: the generator's pipeline; driver.run(opts) is the only Lua function the C host
-- calls (opts: the parsed command line, docs/DESIGN.md 4.1; absent options are nil).
--   cfg -> topology -> partition -> shards -> schedule -> program (verified) -> emit
-- Modes, at most one: --print-out (print the output directory), --dump PASS (a pass's result
-- as JSON), --check (validate only), --inspect [--rank R] (print a report), --sbatch (print a
-- Slurm batch script, launch.lua), --plan (the layouts that fit, fastest first, plan.lua);
-- otherwise render
-- every file in memory and write out/<dir>/. Nothing is written unless every pass succeeded.

require("strict")

local config = require("config")
local diag = require("diag")
local emit = require("emit")
local inspect = require("inspect")
local launch = require("launch")
local plan = require("plan")
local ir = require("ir")
local json = require("json")
local partition = require("partition")
local program = require("program")
local schedule = require("schedule")
local shards = require("shards")
local topology = require("topology")

local M = {}

-- What --dump accepts, in --help order, with the number of passes each needs to run.
M.DUMPS = { { "config", 1 }, { "topology", 2 }, { "partition", 3 }, { "shards", 4 },
            { "schedule", 5 }, { "program", 6 }, { "memory", 6 }, { "schema", 0 } }

local MODES = { "print_out", "dump", "check", "inspect", "sbatch", "plan" }
local MODE_FLAG = { print_out = "--print-out", dump = "--dump", check = "--check",
                    inspect = "--inspect", sbatch = "--sbatch", plan = "--plan" }

-- Run the passes: stop after 'n' of config, topology, partition, shards, schedule, program.
-- The schedule is built once; the program only where the layout has one (--topology-only and
-- --inspect work for every layout: there 'program' is nil when it is not supported).
function M.passes(opts, n, optional_program)
    local r = {}
    r.config = config.load(opts)
    local cfg = r.config
    if n >= 2 then r.topology = topology.build(cfg) end
    if n >= 3 then r.partition = partition.build(cfg, r.topology) end
    if n >= 4 then r.shards = shards.build(cfg, r.topology, r.partition) end
    if n >= 5 then r.schedule = schedule.build(cfg.pp, cfg.vp, cfg.nmb, cfg.mb_group) end
    if n >= 6 and (not optional_program or program.supported(cfg)) then
        r.program = program.build(cfg, r.topology, r.partition, r.shards, r.schedule)
    end
    return r
end

-- With GPU= or GPU_MEM= given: warn when a stage's plan exceeds the device's memory.
function M.warn_memory(opts, cfg, prog)
    if not prog or not (opts.gpu or opts.gpu_mem) then return end
    local dev = plan.device(opts)
    local why = plan.misfit(cfg, prog, dev, opts.gpus_per_node or
                            (dev.name == "cpu" and cfg.world or 8))
    if why then diag.warn(nil, "the plan does not fit %s: %s", dev.text, why) end
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
        if opts.dump == "memory" then
            io.write(json.encode(inspect.memory(r.config, r.program)))
            return
        end
        io.write(json.encode(r[opts.dump]))
        return
    end
    if opts.print_out then
        local cfg = config.load(opts)
        io.write(cfg.outdir, "\n")
        return
    end

    if opts.plan then
        local model = config.load_model(opts.model)
        local dev = plan.device(opts)
        io.write(plan.report(model, opts, dev, plan.plan(model, opts, dev)))
        return
    end

    if opts.sbatch then
        local r = M.passes(opts, 2)
        io.write(emit.sbatch(r.config, launch.sbatch(r.config, r.topology, opts)))
        return
    end
    local only_picture = opts.inspect or opts.topology_only or opts.check
    local r = M.passes(opts, 6, only_picture)
    local cfg, topo, part, sh, sched = r.config, r.topology, r.partition, r.shards, r.schedule
    if opts.check then return end
    if opts.inspect then
        M.warn_memory(opts, cfg, r.program)
        if opts.rank ~= nil then
            io.write(inspect.rank(cfg, topo, part, sh, sched, r.program, opts.rank))
        else
            io.write(inspect.summary(cfg, topo, part, sh, sched, r.program))
        end
        return
    end
    M.warn_memory(opts, cfg, r.program)
    local prog = not opts.topology_only and r.program or nil
    local files = emit.render(cfg, topo, part, sh, sched, prog, { line_dirs = opts.line_dirs })
    emit.write(cfg.outdir, files)
    local names = {}
    for i, f in ipairs(files) do names[i] = f.name end
    io.write(string.format("gen: wrote %s/ (%s)\n", cfg.outdir, table.concat(names, " ")))
end

return M
