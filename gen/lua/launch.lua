-- launch.lua: how a layout is started on a Slurm cluster (gen --sbatch). A pure function of
-- the configuration, the topology and the --sbatch options: the nodes and ranks per node, the
-- program, the time limit and warning, the checkpoint directory and the training flags, checked
-- (the world fills the nodes exactly; tensor-parallel groups stay inside a node; the flags are
-- plain words a shell script can hold). emit.sbatch prints the script from this record.

local diag = require("diag")
local topology = require("topology")

local M = {}

M.DEFAULT_TIME = "24:00:00"
M.DEFAULT_WARN = 120         -- seconds: a checkpoint of a large model is written in that time
-- the characters the training flags may use: they are pasted into the script as shell words
M.SAFE_ARG = "^[%w%-_./=,:+@%%]+$"
-- the flags the script sets itself
local OWN = { ["--ckpt-dir"] = "CKPT_DIR= (--ckpt-dir)", ["--resume"] = "the script",
              ["--exit-signal"] = "the script" }

-- The highest rank of tensor-parallel group g of kind, and its lowest (members ascend).
local function span(kind, g)
    local m = topology.members(kind, g)
    return m[1], m[#m]
end

-- opts: the generator's options (sbatch, nodes, tasks_per_node, backend, time, partition,
-- account, ckpt_dir, warn, train_args). Returns the Launch view emit.sbatch prints.
function M.sbatch(cfg, topo, opts)
    local nodes, per = opts.nodes, opts.tasks_per_node
    if nodes == nil or per == nil then
        diag.error(nil, "--sbatch needs --nodes N and --tasks-per-node N (NODES=, GPUS_PER_NODE=)")
    end
    if nodes < 1 or per < 1 then
        diag.error(nil, "--nodes (%d) and --tasks-per-node (%d) must be at least 1", nodes, per)
    end
    if nodes * per ~= cfg.world then
        diag.error(nil, "%d nodes x %d ranks per node = %d ranks, but the layout has %d (tp%d " ..
                   "pp%d dp%d%s): choose NODES x GPUS_PER_NODE = %d", nodes, per, nodes * per,
                   cfg.world, cfg.tp, cfg.pp, cfg.dp, cfg.cp > 1 and (" cp" .. cfg.cp) or "",
                   cfg.world)
    end
    -- tensor parallelism communicates in every layer: its groups must not cross nodes
    for _, name in ipairs({ "tp", "etp" }) do
        local i = topo.index[name]
        local kind = i and topo.kinds[i]
        if kind and kind.size > 1 then
            for g = 0, kind.count - 1 do
                local lo, hi = span(kind, g)
                if lo // per ~= hi // per then
                    diag.error(nil, "%s group %d (ranks %d..%d) spans two nodes of %d ranks: " ..
                               "tensor parallelism must stay inside a node (GPUS_PER_NODE a " ..
                               "multiple of %s %d, and %s first in the rank order)",
                               string.upper(name), g, lo, hi, per, string.upper(name), kind.size,
                               name)
                end
            end
        end
    end
    local backend = opts.backend or "cuda"
    if backend ~= "cuda" and backend ~= "cpu" then
        diag.error(nil, "--backend %s: cuda or cpu", backend)
    end
    local time = opts.time or M.DEFAULT_TIME
    if not (time:match("^%d+:%d%d:%d%d$") or time:match("^%d+%-%d+:%d%d:%d%d$")) then
        diag.error(nil, "--time %s: a Slurm time limit as [D-]HH:MM:SS", time)
    end
    local warn = opts.warn or M.DEFAULT_WARN
    if warn < 10 or warn > 65535 then
        diag.error(nil, "--warn %d: seconds of warning before the time limit, 10..65535 " ..
                   "(Slurm's --signal)", warn)
    end
    local words = {}
    for w in (opts.train_args or ""):gmatch("%S+") do
        if not w:match(M.SAFE_ARG) then
            diag.error(nil, "--train-args: '%s' holds characters a batch script would have to " ..
                       "quote (letters, digits and -_./=,:+@%% only)", w)
        end
        local flag = w:match("^(%-%-[%w%-]+)")
        if flag and OWN[flag] then
            diag.error(nil, "--train-args: %s is set by %s", flag, OWN[flag])
        end
        words[#words + 1] = w
    end
    for _, v in ipairs({ { "partition", opts.partition }, { "account", opts.account },
                         { "ckpt-dir", opts.ckpt_dir } }) do
        if v[2] and not v[2]:match(M.SAFE_ARG) then
            diag.error(nil, "--%s '%s': letters, digits and -_./=,:+@%% only", v[1], v[2])
        end
    end
    local dir = cfg.outdir
    local program = dir .. "/" .. (backend == "cuda" and "train_cuda" or "train")
    local ckpt = opts.ckpt_dir or ("ckpt/" .. cfg.dirname)
    local directives = { "--job-name=gen-" .. cfg.dirname, "--nodes=" .. nodes,
                         "--ntasks-per-node=" .. per }
    local function add(d) directives[#directives + 1] = d end
    if backend == "cuda" then add("--gpus-per-node=" .. per) end
    add("--time=" .. time)
    if opts.partition then add("--partition=" .. opts.partition) end
    if opts.account then add("--account=" .. opts.account) end
    add("--signal=B:USR1@" .. warn)      -- to this script (B:), which passes it on
    add("--requeue")
    add("--open-mode=append")            -- a requeued job's output follows the first's
    add("--output=" .. dir .. "/slurm-%j.out")
    local cmd = { "srun --mpi=pmix --kill-on-bad-exit=1", program, "--ckpt-dir", ckpt,
                  "--resume --exit-signal SIGUSR1,SIGTERM" }
    for _, w in ipairs(words) do cmd[#cmd + 1] = w end
    return {
        nodes = nodes, per_node = per, world = cfg.world, tp = cfg.tp, gpus = backend == "cuda",
        program = program, outdir = dir, warn = warn, ckpt = ckpt, directives = directives,
        command = table.concat(cmd, " "),
    }
end

return M
