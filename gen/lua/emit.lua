-- emit.lua: render the output files in memory, then write them: the only module that writes.
-- emit.render(cfg, topo, part, sh) -> File list (topology.json, shards.json, report.txt,
-- schedule.svg, MANIFEST); emit.write(outdir, files) writes every file to a temporary name
-- first and renames them only when all were written, so a failed run leaves out/ as it was;
-- files whose text is already there are left alone, so make rebuilds only what changed.
-- Output depends only on the inputs: no timestamps, no absolute paths, no pairs() order.
-- Formats: topology.json as issue 2 gives it; shards.json as described above shards_json.

local diag = require("diag")
local host = require("host")
local tmpl = require("tmpl")
local util = require("util")
local inspect = require("inspect")
local schedule = require("schedule")
local svg = require("svg")
local ir = require("ir")
local json = require("json")

local M = {}

M.SHARDS_FORMAT = "shards/1"

local function bool(b) return b and "true" or "false" end

-- -- topology.json -------------------------------------------------------------------------------

function M.topology_json(cfg, topo, part)
    local out = {}
    local s = topo.sizes
    out[#out + 1] = string.format('{"model": %s, "world": %d, "order": %s,\n',
                                  json.str(cfg.model.name), topo.world, json.str(cfg.order))
    out[#out + 1] = string.format(' "sizes": {"tp": %d, "cp": %d, "dp": %d, "pp": %d, "ep": %d, ' ..
                                  '"etp": %d, "edp": %d, "vp": %d},\n',
                                  s.tp, s.cp, s.dp, s.pp, s.ep, s.etp, s.edp, s.vp)
    out[#out + 1] = ' "groups": {\n'
    for i, kind in ipairs(topo.kinds) do
        local m, n, groups = kind.members, kind.size, { "  " .. json.str(kind.name) .. ": [" }
        for g = 0, kind.count - 1 do
            groups[#groups + 1] = (g > 0 and ",[" or "[")
                                  .. table.concat(m, ",", g * n + 1, g * n + n) .. "]"
        end
        groups[#groups + 1] = i < #topo.kinds and "],\n" or "]\n"
        out[#out + 1] = table.concat(groups)
    end
    out[#out + 1] = ' },\n "ranks": [\n'

    -- Per stage: the chunks text and duties; per axis: stride and size.
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
    local function axis(grid, name)
        for i, a in ipairs(grid.axes) do
            if a == name then return grid.strides[i], grid.sizes[i] end
        end
    end
    local d, e = topo.dense, topo.expert
    local s_tp, n_tp = axis(d, "tp")
    local s_cp, n_cp = axis(d, "cp")
    local s_dp, n_dp = axis(d, "dp")
    local s_pp, n_pp = axis(d, "pp")
    local s_ep, n_ep = axis(e, "ep")
    local s_et, n_et = axis(e, "tp")
    local s_ed, n_ed = axis(e, "dp")
    local fmt = '  {"rank": %d, "tp": %d, "cp": %d, "dp": %d, "pp": %d, "ep": %d, "etp": %d, ' ..
                '"edp": %d, %s%s\n'
    local W, batch = topo.world, {}
    for r = 0, W - 1 do
        batch[#batch + 1] = string.format(fmt, r, (r // s_tp) % n_tp, (r // s_cp) % n_cp,
                                          (r // s_dp) % n_dp, (r // s_pp) % n_pp,
                                          (r // s_ep) % n_ep, (r // s_et) % n_et,
                                          (r // s_ed) % n_ed, stage_text[(r // s_pp) % n_pp],
                                          r < W - 1 and "," or "")
        if #batch == 1024 or r == W - 1 then   -- fewer live strings for large worlds
            out[#out + 1] = table.concat(batch)
            batch = {}
        end
    end
    out[#out + 1] = " ]}\n"
    return table.concat(out)
end

-- -- shards.json ---------------------------------------------------------------------------------

-- shards.json, format "shards/1": the Shards record (ir.lua), one param, buffer or bytes
-- record per line, fields in their ir.lua order and with their ir.lua meanings:
--   {"format": "shards/1", "model": NAME, "world": W,
--    "dtypes": [Dtype, ...],
--    "unique": N, "unique_dense": N, "unique_expert": N, "held": N,
--    "rank_class": [class id of rank 0, of rank 1, ...],
--    "classes": [
--     {"id", "pp", "tp", "ep", "etp", "ranks", "first", "numel",
--      "params": [Param, ...],   pieces last: {"start": [..], "size": [..], "at": [..]}
--      "buffers": [Buffer, ...], with their Buckets and Slots
--      "bytes": [Bytes, ...]}, ...]}
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
    out[#out + 1] = ' "rank_class": [' .. table.concat(sh.rank_class, ",") .. '],\n'
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

-- -- MANIFEST ------------------------------------------------------------------------------------

function M.manifest(cfg, files)
    local lines = {
        "# MANIFEST: generated by gen -- DO NOT EDIT. The files of this directory:",
        "# model:      " .. cfg.model.file,
        string.format("# layout:     tp%d pp%d dp%d cp%d ep%d etp%d vp%d (world %d, order %s)",
                      cfg.tp, cfg.pp, cfg.dp, cfg.cp, cfg.ep, cfg.etp, cfg.vp, cfg.world,
                      cfg.order),
        "# regenerate: " .. cfg.make,
    }
    local width = 0
    for _, f in ipairs(files) do width = math.max(width, #f.name) end
    width = math.max(width, #"MANIFEST")
    for _, f in ipairs(files) do
        lines[#lines + 1] = string.format("%-" .. width .. "s  %s", f.name, f.what)
    end
    lines[#lines + 1] = string.format("%-" .. width .. "s  %s", "MANIFEST", "this list")
    return table.concat(lines, "\n") .. "\n"
end

-- -- The training program (docs/PROGRAM.md) ------------------------------------------------------

-- The banner of a generated source: what produced it, the model, layout and regenerate command.
local function banner(cfg, template, extra)
    local lines = {
        "Generated by gen from " .. template .. " -- DO NOT EDIT.",
        string.format("model : %s   layout: tp%d pp%d dp%d%s%s (world %d)", cfg.model.file,
                      cfg.tp, cfg.pp, cfg.dp, cfg.cp > 1 and (" cp" .. cfg.cp) or "",
                      cfg.vp > 1 and (" vp" .. cfg.vp) or "", cfg.world),
        string.format("batch : micro-batch %d x %d micro-batches x dp %d, sequence %d%s%s",
                      cfg.mbs, cfg.nmb, cfg.dp, cfg.seq, cfg.sp and ", SP" or "",
                      cfg.dist_opt and ", distributed optimizer" or ""),
    }
    for _, l in ipairs(extra or {}) do lines[#lines + 1] = l end
    lines[#lines + 1] = "regenerate: " .. cfg.make
    return lines
end

-- Ranks that run stage 'k', compactly ("4-7", "1,3,5,7").
local function stage_ranks(topo, k)
    local pp = require("topology").kind(topo, "pp")
    local list = {}
    for g = 0, pp.count - 1 do list[#list + 1] = pp.members[g * pp.size + k + 1] end
    table.sort(list)
    return util.ranks(list)
end

-- schedule.svg: the schedule (program.build verifies the same one) on svg.lua's time model.
local function schedule_svg(cfg, topo)
    local labels = {}
    for r = 0, cfg.pp - 1 do labels[r] = string.format("stage %d (%s)", r, stage_ranks(topo, r)) end
    local sched = schedule.build(cfg.pp, cfg.vp, cfg.nmb)
    local _, bubble = inspect.pipeline_bubble(cfg)
    local title = string.format("%s, tp%d pp%d dp%d%s: %s", cfg.model.name, cfg.tp, cfg.pp,
                                cfg.dp, cfg.vp > 1 and (" vp" .. cfg.vp) or "",
                                inspect.schedule_text(cfg, sched.kind))
    return svg.render(sched, { labels = labels, title = title,
                               note = "predicted bubble " .. bubble })
end

local function render_program(cfg, topo, prog, files, opts)
    local ropts = { line_dirs = opts and opts.line_dirs or false }
    local function add(name, template, env, what)
        files[#files + 1] = ir.File { name = name, text = tmpl.render(template, env, ropts),
                                      what = what }
    end
    local T = "templates/program/"
    add("model.h", T .. "model.h.tmpl",
        { banner = banner(cfg, T .. "model.h.tmpl"), consts = prog.consts,
          groups = prog.groups, moe = prog.moe }, "sizes, structs and prototypes every source includes")
    add("model.c", T .. "model.c.tmpl",
        { banner = banner(cfg, T .. "model.c.tmpl"), tp = prog.tp, sp = prog.sp, moe = prog.moe },
        "layer, embedding and head forward/backward with the tp/sp communication")
    local K = "templates/kernels/kernels.tmpl"
    add("kernels.c", K, { banner = banner(cfg, K, { "CPU kernels (loops over rows on the " ..
        "runtime's thread pool)" }), cuda = false, HD = "static inline", GLOBAL = "static",
        moe = prog.moe },
        "kernels, CPU backend")
    add("kernels.cu", K, { banner = banner(cfg, K, { "CUDA kernels" }), cuda = true,
                           HD = "static __device__ inline", GLOBAL = "static __global__",
                           moe = prog.moe },
        "kernels, CUDA backend")
    for _, s in ipairs(prog.stages) do
        local tmpl_name = T .. "stage.c.tmpl"
        add("stage" .. s.k .. ".c", tmpl_name,
            { banner = banner(cfg, tmpl_name, { s.title, "run by ranks " ..
                  stage_ranks(topo, tonumber(s.k)) .. string.format(
                  "; %s schedule: %s warm-up, %s steady, %s cool-down; %s in flight",
                  prog.schedule_kind, s.warmup, s.steady, s.cooldown, s.inflight) }),
              s = s, dist_opt = prog.dist_opt, mp = prog.mp, moe = prog.moe,
              tpeppn = prog.tpeppn, alias_head_wte = s.first and s.last,
              grad_scale = prog.dpcp },
            "stage " .. s.k .. " program: " .. s.title:gsub("^stage %d+ of %d+: ", ""))
    end
    local stages = {}
    for i, s in ipairs(prog.stages) do stages[i] = { cname = s.cname } end
    add("train.c", T .. "train.c.tmpl",
        { banner = banner(cfg, T .. "train.c.tmpl"), stages = stages, run_hint = prog.run_hint,
          tensors = prog.tensors, ntensors = prog.ntensors, moe = prog.moe },
        "main: flags, data, checkpoints, the step loop")
    add("groups.c", T .. "groups.c.tmpl",
        { banner = banner(cfg, T .. "groups.c.tmpl"), groups = prog.groups,
          stage_rows = prog.stage_rows, coord_rows = prog.coord_rows,
          vocab_valid = prog.vocab_valid },
        "rank-group tables, rank -> stage and coordinates")
    if prog.moe then
        add("moe.c", T .. "moe.c.tmpl",
            { banner = banner(cfg, T .. "moe.c.tmpl"), moe_ep = prog.moe_ep,
              moe_etp = prog.moe_etp, moe_comm = prog.moe_ep or prog.moe_etp,
              moe_tp = prog.moe_tp, capacity = prog.capacity,
              bias = prog.bias, pre_softmax = prog.pre_softmax },
            "the mixture-of-experts block: routing, all-to-all dispatch, experts, combine")
    end
    local sources = { "model.c", "train.c", "groups.c" }
    if prog.moe then sources[#sources + 1] = "moe.c" end
    for _, s in ipairs(prog.stages) do sources[#sources + 1] = "stage" .. s.k .. ".c" end
    add("build.mk", T .. "build.mk.tmpl",
        { sources = sources, regen = cfg.make }, "make rules for train and train_cuda")
end

-- Every output file, rendered. The MANIFEST comes last and lists the others. 'prog' (from
-- program.build) adds the training program's sources; without it only the build-time picture.
function M.render(cfg, topo, part, sh, prog, opts)
    local files = {
        ir.File { name = "topology.json", text = M.topology_json(cfg, topo, part),
                  what = "rank groups of every kind; coordinates, layers, duties of every rank" },
        ir.File { name = "shards.json", text = M.shards_json(cfg, sh),
                  what = "parameter pieces per rank class, rank -> class, buffer layout, bytes" },
        ir.File { name = "report.txt", text = inspect.summary(cfg, topo, part, sh),
                  what = "all ranks by stage, parameter counts, memory per rank (make inspect)" },
        ir.File { name = "schedule.svg", text = schedule_svg(cfg, topo),
                  what = "the pipeline schedule drawn: stages x time, F and B per micro-batch" },
    }
    if prog then render_program(cfg, topo, prog, files, opts) end
    files[#files + 1] = ir.File { name = "MANIFEST", text = M.manifest(cfg, files),
                                  what = "this list" }
    return files
end

-- Write 'files' into directory 'outdir' (created if needed): all to temporary names first,
-- then renamed into place. On failure raises a user error; files already in place stay.
function M.write(outdir, files)
    local ok, err = host.mkdir_p(outdir)
    if not ok then diag.error(nil, "%s", err) end
    local tmps = {}
    for i, f in ipairs(files) do
        -- a file already there with this text stays untouched (its time too), so make
        -- recompiles only what changed after a regeneration
        local old = io.open(outdir .. "/" .. f.name, "rb")
        local same = old and old:read("a") == f.text
        if old then old:close() end
        if same then goto next_file end
        local tmp = outdir .. "/." .. f.name .. ".tmp"
        local h, oerr = io.open(tmp, "wb")
        if not h then diag.error(nil, "cannot write %s", oerr) end
        local wok, werr = h:write(f.text)
        local cok, cerr = h:close()
        if not (wok and cok) then
            os.remove(tmp)
            diag.error(nil, "cannot write %s: %s", tmp, tostring(werr or cerr))
        end
        tmps[i] = tmp
        ::next_file::
    end
    for i, f in ipairs(files) do
        if tmps[i] then
            local rok, rerr = host.rename(tmps[i], outdir .. "/" .. f.name)
            if not rok then diag.error(nil, "%s", rerr) end
        end
    end
end

return M
