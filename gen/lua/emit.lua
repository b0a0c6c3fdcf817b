-- emit.lua: render the output files in memory, then write them: the only module that writes.
-- emit.render(cfg, topo, part, sh) -> File list (topology.json, shards.json, report.txt,
-- MANIFEST); emit.write(outdir, files) writes every file to a temporary name first and renames
-- them only when all were written, so a failed run leaves out/ as it was. Output depends only
-- on the inputs: no timestamps, no absolute paths, no pairs() order.
-- Formats: topology.json as issue 2 gives it; shards.json as described above shards_json.

local diag = require("diag")
local inspect = require("inspect")
local ir = require("ir")
local json = require("json")

local M = {}

M.SHARDS_FORMAT = "shards/1"

local function ints(list)
    local parts = {}
    for i, v in ipairs(list) do parts[i] = string.format("%d", v) end
    return "[" .. table.concat(parts, ", ") .. "]"
end

-- {"k": v, ...} from an array of {key, json text}.
local function obj(fields)
    local parts = {}
    for i, f in ipairs(fields) do parts[i] = json.str(f[1]) .. ": " .. f[2] end
    return "{" .. table.concat(parts, ", ") .. "}"
end

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
        local groups, m, n = {}, kind.members, kind.size
        for g = 0, kind.count - 1 do
            groups[g + 1] = "[" .. table.concat(m, ",", g * n + 1, g * n + n) .. "]"
        end
        out[#out + 1] = string.format('  %s: [%s]%s\n', json.str(kind.name),
                                      table.concat(groups, ","), i < #topo.kinds and "," or "")
    end
    out[#out + 1] = ' },\n "ranks": [\n'

    -- Per stage: the chunks text and duties; per axis: stride and size.
    local stage_text = {}
    for _, st in ipairs(part.stages) do
        local chunks, emb, head = {}, false, false
        for i, c in ipairs(st.chunks) do
            local layers = {}
            for l = c.first, c.first + c.count - 1 do layers[#layers + 1] = l end
            chunks[i] = string.format('{"vp": %d, "layers": %s}', c.vp, ints(layers))
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
    local W = topo.world
    for r = 0, W - 1 do
        out[#out + 1] = string.format(fmt, r, (r // s_tp) % n_tp, (r // s_cp) % n_cp,
                                      (r // s_dp) % n_dp, (r // s_pp) % n_pp, (r // s_ep) % n_ep,
                                      (r // s_et) % n_et, (r // s_ed) % n_ed,
                                      stage_text[(r // s_pp) % n_pp], r < W - 1 and "," or "")
    end
    out[#out + 1] = " ]}\n"
    return table.concat(out)
end

-- -- shards.json ---------------------------------------------------------------------------------

local function param_json(p)
    local f = { { "name", json.str(p.name) }, { "role", json.str(p.role) } }
    if p.layer then f[#f + 1] = { "layer", string.format("%d", p.layer) } end
    if p.expert_id then f[#f + 1] = { "expert_id", string.format("%d", p.expert_id) } end
    local pieces = {}
    for i, pc in ipairs(p.pieces) do
        pieces[i] = obj({ { "start", ints(pc.start) }, { "size", ints(pc.size) },
                          { "at", ints(pc.at) } })
    end
    local rest = {
        { "chunk", string.format("%d", p.chunk) }, { "shape", ints(p.shape) },
        { "local_shape", ints(p.local_shape) }, { "numel", string.format("%d", p.numel) },
        { "split", json.str(p.split) }, { "tp_sharded", bool(p.tp_sharded) },
        { "tp_duplicate", bool(p.tp_duplicate) }, { "expert", bool(p.expert) },
        { "tied", bool(p.tied) }, { "seq_parallel", bool(p.seq_parallel) },
        { "shared_embedding", bool(p.shared_embedding) }, { "buffer", json.str(p.buffer) },
    }
    for _, x in ipairs(rest) do f[#f + 1] = x end
    local reduce = {}
    for i, g in ipairs(p.reduce) do reduce[i] = json.str(g) end
    f[#f + 1] = { "reduce", "[" .. table.concat(reduce, ", ") .. "]" }
    f[#f + 1] = { "pieces", "[" .. table.concat(pieces, ", ") .. "]" }
    return obj(f)
end

local function buffer_json(b)
    local buckets = {}
    for i, bk in ipairs(b.buckets) do
        local slots = {}
        for j, s in ipairs(bk.slots) do
            slots[j] = string.format("[%s, %d, %d]", json.str(s.name), s.offset, s.numel)
        end
        buckets[i] = obj({ { "start", string.format("%d", bk.start) },
                           { "size", string.format("%d", bk.size) },
                           { "shard", string.format("%d", bk.shard) },
                           { "slots", "[" .. table.concat(slots, ", ") .. "]" } })
    end
    return obj({ { "chunk", string.format("%d", b.chunk) }, { "kind", json.str(b.kind) },
                 { "dp_shards", string.format("%d", b.dp_shards) },
                 { "numel", string.format("%d", b.numel) }, { "size", string.format("%d", b.size) },
                 { "shard", string.format("%d", b.shard) },
                 { "buckets", "[" .. table.concat(buckets, ", ") .. "]" } })
end

-- shards.json, format "shards/1" (one class per block, one param per line):
--   {"format": "shards/1", "model": NAME, "world": W,
--    "dtypes": [{"name", "label", "param", "grad", "optim"}, ...]     bytes per element
--    "unique", "unique_dense", "unique_expert", "held": element counts (see ir.Shards)
--    "rank_class": [class id of rank 0, of rank 1, ...],
--    "classes": [{"class", "pp", "tp", "ep", "etp", "ranks", "first", "numel",
--       "params": [{"name", "role", ["layer"], ["expert_id"], "chunk", "shape",
--                   "local_shape", "numel", "split", "tp_sharded", "tp_duplicate", "expert",
--                   "tied", "seq_parallel", "shared_embedding", "buffer", "reduce",
--                   "pieces": [{"start": [..], "size": [..], "at": [..]}]}],
--       "buffers": [{"chunk", "kind", "dp_shards", "numel", "size", "shard",
--                    "buckets": [{"start", "size", "shard",
--                                 "slots": [[param name, offset, numel], ...]}]}],
--       "bytes": [{"dtype", "dist_opt", "params", "grads", "optim", "total"}]}]}
-- Field meanings are those of the ir.lua records of the same names. Pieces give, per
-- dimension, the global start, the extent, and the start inside the local tensor.
function M.shards_json(cfg, sh)
    local out = {}
    out[#out + 1] = string.format('{"format": %s, "model": %s, "world": %d,\n',
                                  json.str(M.SHARDS_FORMAT), json.str(cfg.model.name), cfg.world)
    local dtypes = {}
    for i, d in ipairs(sh.dtypes) do
        dtypes[i] = obj({ { "name", json.str(d.name) }, { "label", json.str(d.label) },
                          { "param", string.format("%d", d.param) },
                          { "grad", string.format("%d", d.grad) },
                          { "optim", string.format("%d", d.optim) } })
    end
    out[#out + 1] = ' "dtypes": [' .. table.concat(dtypes, ",\n            ") .. '],\n'
    out[#out + 1] = string.format(' "unique": %d, "unique_dense": %d, "unique_expert": %d, ' ..
                                  '"held": %d,\n', sh.unique, sh.unique_dense, sh.unique_expert,
                                  sh.held)
    out[#out + 1] = ' "rank_class": [' .. table.concat(sh.rank_class, ",") .. '],\n'
    out[#out + 1] = ' "classes": [\n'
    for ci, c in ipairs(sh.classes) do
        out[#out + 1] = string.format('  {"class": %d, "pp": %d, "tp": %d, "ep": %d, "etp": %d, ' ..
                                      '"ranks": %d, "first": %d, "numel": %d,\n',
                                      c.id, c.pp, c.tp, c.ep, c.etp, c.ranks, c.first, c.numel)
        out[#out + 1] = '   "params": [\n'
        for i, p in ipairs(c.params) do
            out[#out + 1] = "    " .. param_json(p) .. (i < #c.params and ",\n" or "\n")
        end
        out[#out + 1] = '   ],\n   "buffers": [\n'
        for i, b in ipairs(c.buffers) do
            out[#out + 1] = "    " .. buffer_json(b) .. (i < #c.buffers and ",\n" or "\n")
        end
        out[#out + 1] = '   ],\n   "bytes": [\n'
        for i, b in ipairs(c.bytes) do
            out[#out + 1] = "    " .. obj({ { "dtype", json.str(b.dtype) },
                                            { "dist_opt", bool(b.dist_opt) },
                                            { "params", string.format("%d", b.params) },
                                            { "grads", string.format("%d", b.grads) },
                                            { "optim", string.format("%d", b.optim) },
                                            { "total", string.format("%d", b.total) } })
                            .. (i < #c.bytes and ",\n" or "\n")
        end
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

-- Every output file, rendered. The MANIFEST comes last and lists the others.
function M.render(cfg, topo, part, sh)
    local files = {
        ir.File { name = "topology.json", text = M.topology_json(cfg, topo, part),
                  what = "rank groups of every kind; coordinates, layers and duties of every rank" },
        ir.File { name = "shards.json", text = M.shards_json(cfg, sh),
                  what = "parameter pieces per rank class, rank -> class, buffer layout, bytes" },
        ir.File { name = "report.txt", text = inspect.summary(cfg, topo, part, sh),
                  what = "all ranks by stage, parameter counts, memory per rank (make inspect)" },
    }
    files[#files + 1] = ir.File { name = "MANIFEST", text = M.manifest(cfg, files),
                                  what = "this list" }
    return files
end

-- Write 'files' into directory 'outdir' (created if needed): all to temporary names first,
-- then renamed into place. On failure raises a user error; files already in place stay.
function M.write(outdir, files)
    local host = package.loaded.host or require("host")
    local ok, err = host.mkdir_p(outdir)
    if not ok then diag.error(nil, "%s", err) end
    local tmps = {}
    for i, f in ipairs(files) do
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
    end
    for i, f in ipairs(files) do
        local rok, rerr = host.rename(tmps[i], outdir .. "/" .. f.name)
        if not rok then diag.error(nil, "%s", rerr) end
    end
end

return M
