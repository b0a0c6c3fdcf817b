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
-- Everything below only prints program.build's record: C spellings of its enums and numbers,
-- aligned columns and comments. The decisions are all in the record.

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

-- A float as a C literal ("1.0f", not "1f").
local function cfloat(x)
    local t = string.format("%.9g", x)
    if not t:find("[.eEn]") then t = t .. ".0" end
    return t .. "f"
end

local function int(x)
    assert(math.type(x) == "integer", "emit: expected an integer")
    return string.format("%d", x)
end

local function flag(b) return b and "1" or "0" end

-- model.h's constants, aligned: {name, value, comment}.
local function const_view(consts)
    local rows, w1, w2 = {}, 0, 0
    for i, c in ipairs(consts) do
        local v = c.kind == "int" and int(c.value) or c.kind == "float" and cfloat(c.value)
                  or '"' .. c.value .. '"'
        rows[i] = { c.name, v, c.comment }
        w1, w2 = math.max(w1, #c.name), math.max(w2, #v)
    end
    local out = {}
    for i, r in ipairs(rows) do
        out[i] = { name = r[1] .. string.rep(" ", w1 - #r[1]),
                   value = r[2] .. string.rep(" ", w2 - #r[2]), comment = r[3] }
    end
    return out
end

local function group_expr(id)
    if id == "WORLD" then return "rt_group_world()" end
    return "gpt.grp[GPT_GRP_" .. id .. "]"
end

-- Words in lines of at most 'width' characters.
local function wrap(words, width)
    local lines, cur = {}, nil
    for _, w in ipairs(words) do
        if cur and #cur + 1 + #w <= width then cur = cur .. " " .. w
        else
            if cur then lines[#lines + 1] = cur end
            cur = w
        end
    end
    lines[#lines + 1] = cur
    return lines
end

-- C initializer rows "{ a, b, c },", columns aligned (numbers to the right), each with its
-- comment after it when the line stays within 100 columns, else on a line of its own above.
-- Returns a list of {has_above, above (comment), line} for the template.
local function aligned(rows, comments, prefix)
    prefix = prefix or 4            -- columns before the row: indentation and a designator
    local width, numeric = {}, {}
    for _, r in ipairs(rows) do
        for i, c in ipairs(r) do
            width[i] = math.max(width[i] or 0, #c)
            if numeric[i] == nil then numeric[i] = true end
            numeric[i] = numeric[i] and c:match("^%-?%d+$") ~= nil
        end
    end
    local lines, fits = {}, true
    for k, r in ipairs(rows) do
        local cells = {}
        for i, c in ipairs(r) do
            local pad = string.rep(" ", width[i] - #c)
            local sep = i < #r and "," or ""
            cells[i] = numeric[i] and (pad .. c .. sep) or (i < #r and c .. sep .. pad or c)
        end
        lines[k] = "{ " .. table.concat(cells, " ") .. " },"
        local note = comments and comments[k]
        if note and prefix + #lines[k] + #note + 9 > 100 then fits = false end
    end
    -- every comment after its row, or (when one would not fit) every comment above its row
    local out = {}
    for k, line in ipairs(lines) do
        local note = comments and comments[k]
        if note and fits then
            out[k] = { has_above = false, above = "", line = line .. "   /* " .. note .. " */" }
        else
            out[k] = { has_above = note ~= nil, above = note or "", line = line }
        end
    end
    return out
end

-- A comment of several lines, at most 100 columns with 'indent' spaces before it: the lines
-- to print after the indentation ("/* ...", "** ...", last with " */").
local function comment(text, indent)
    local words = {}
    for w in text:gmatch("%S+") do words[#words + 1] = w end
    local lines = wrap(words, 100 - indent - 6)
    if #lines == 1 then return { "/* " .. lines[1] .. " */" } end
    for i, l in ipairs(lines) do
        lines[i] = (i == 1 and "/* " or "** ") .. l .. (i == #lines and " */" or "")
    end
    return lines
end

-- The cells of a gpt_param row and of a gpt_piece row (lib/gpt.h field order).
local function param_cells(p)
    local flags = {}
    if p.decay then flags[#flags + 1] = "GPT_DECAY" end
    if p.sp_reduce then flags[#flags + 1] = "GPT_SP_REDUCE" end
    flags[#flags + 1] = "GPT_NORM_" .. p.norm
    return { "GPT_P_" .. p.field, int(p.expert), int(p.buf), table.concat(flags, " | "),
             int(p.role), int(p.ld), int(p.offset), int(p.n) }
end

local function piece_cells(pc)
    local flags = {}
    if pc.replicated then flags[#flags + 1] = "GPT_REPLICATED" end
    if pc.tied then flags[#flags + 1] = "GPT_TIED_COPY" end
    if pc.expert then flags[#flags + 1] = "GPT_EXPERT_PIECE" end
    if pc.vocab then flags[#flags + 1] = "GPT_VOCAB_ROWS" end
    return { int(pc.param), int(pc.lrow), int(pc.lcol), int(pc.grow), int(pc.gcol),
             int(pc.rows), int(pc.cols), "GPT_SPLIT_" .. pc.split, int(pc.step_row),
             int(pc.step_col), #flags > 0 and table.concat(flags, " | ") or "0" }
end

-- Aligned rows of params (commented with their names) and of their pieces.
local function param_rows(params)
    local cells, notes = {}, {}
    for i, p in ipairs(params) do cells[i], notes[i] = param_cells(p), p.name end
    return aligned(cells, notes)
end

local function piece_rows(pieces, params)
    local cells, notes = {}, {}
    for i, pc in ipairs(pieces) do
        cells[i] = piece_cells(pc)
        notes[i] = params[pc.param + 1].name
    end
    return aligned(cells, notes)
end

local function list_view(list, f)
    local out = {}
    for i, x in ipairs(list) do out[i] = f(x) end
    return out
end

local function schedule_title(cfg, kind)
    if kind == "none" then
        return string.format("no pipelining, %d micro-batches (gradient accumulation)", cfg.nmb)
    end
    return string.format("%s, %d micro-batches", kind == "interleaved" and
                         ("interleaved 1F1B over " .. cfg.vp .. " chunks") or "1F1B", cfg.nmb)
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
local function schedule_svg(cfg, topo, sched)
    local labels = {}
    for r = 0, cfg.pp - 1 do labels[r] = string.format("stage %d (%s)", r, stage_ranks(topo, r)) end
    local _, bubble = inspect.pipeline_bubble(cfg)
    local title = string.format("%s, tp%d pp%d dp%d%s: %s", cfg.model.name, cfg.tp, cfg.pp,
                                cfg.dp, cfg.vp > 1 and (" vp" .. cfg.vp) or "",
                                inspect.schedule_text(cfg, sched.kind))
    return svg.render(sched, { labels = labels, title = title,
                               note = "predicted bubble " .. bubble })
end

-- The kinds of the step's tail ops (program.lua tail_ops; ir.lua Op).
local TAIL_KINDS = { "BEGIN", "SCHEDULE", "SP_ALLREDUCE", "EMBD_ALLREDUCE", "GRAD_SCALE",
                     "GRAD_ALLREDUCE", "GRAD_REDUCE_SCATTER", "NORM_LOCAL", "NORM_ALLREDUCE",
                     "NORM", "ADAMW", "PARAM_ALLGATHER", "AUX_ALLREDUCE", "LOSS_ALLREDUCE" }

-- The view of one stage for stage.c.tmpl.
local function stage_view(cfg, prog, sp, part)
    local st = part.stages[sp.stage + 1]
    local v = {
        cname = "stage" .. sp.stage, title = sp.title, nbuffers = int(#sp.buffers),
        nchunks = int(#sp.chunks), buffers = {}, chunks = {}, schedule = {}, tail = {},
        mem = {}, mem_total = int(sp.mem_bytes), needs_inputs = flag(sp.needs_inputs),
        needs_targets = flag(sp.needs_targets), head_uses_wte = flag(sp.head_uses_wte),
        has_others = #sp.other_params > 0, nothers = int(#sp.other_params),
        nother_pieces = int(#sp.other_pieces), others = param_rows(sp.other_params),
        other_pieces = piece_rows(sp.other_pieces, sp.other_params),
        schedule_title = schedule_title(cfg, prog.schedule_kind),
        no_aux = cfg.model.moe == nil,
    }
    local bcells, bnotes = {}, {}
    for i, b in ipairs(sp.buffers) do
        local kcells = {}
        for j, k in ipairs(b.buckets) do
            kcells[j] = { int(k.start), int(k.size), int(k.shard), int(k.base) }
        end
        v.buffers[i] = { i = int(i - 1), nbuckets = int(#b.buckets), buckets = aligned(kcells) }
        bcells[i] = { int(b.chunk), flag(b.expert), int(b.size), flag(b.sharded), int(b.state),
                      "GPT_GRP_" .. b.group, int(#b.buckets), "buffer" .. (i - 1) .. "_buckets" }
        bnotes[i] = string.format("chunk %d, %s", b.chunk, b.expert and "experts" or "dense")
    end
    v.buffer_rows = aligned(bcells, bnotes)
    local calls_of = {}      -- chunk -> {fwd, bwd}: the calls of its F and B ops
    for _, o in ipairs(sp.schedule) do
        if o.kind == "F" or o.kind == "B" then
            calls_of[o.chunk] = calls_of[o.chunk] or {}
            calls_of[o.chunk][o.kind] = o.calls
        end
    end
    local function call_view(k)
        local c = { layer = k.layer and int(k.layer), global = k.global and int(k.global) }
        for _, op in ipairs({ "embedding_fwd", "layer_fwd", "head_fwd_bwd", "layer_bwd",
                              "embedding_bwd" }) do
            c[op] = k.op == op
        end
        return c
    end
    local ccells = {}
    for i, c in ipairs(sp.chunks) do
        ccells[i] = { int(c.first), int(c.layers), int(c.slots), flag(c.embedding),
                      flag(c.head), int(#sp.layer_params[i]), "chunk" .. c.vp .. "_params",
                      int(#sp.layer_pieces[i]), "chunk" .. c.vp .. "_pieces",
                      "chunk" .. c.vp .. "_bases" }
        local bases = {}
        for j, b in ipairs(c.bases) do
            local vals = {}
            for k, x in ipairs(b) do vals[k] = int(x) end
            bases[j] = { values = table.concat(vals, ", ") .. ",", layer = int(c.first + j - 1) }
        end
        v.chunks[i] = {
            c = int(c.vp), first = int(c.first), layers = int(c.layers), slots = int(c.slots),
            embedding = flag(c.embedding), head = flag(c.head),
            nparams = int(#sp.layer_params[i]), npieces = int(#sp.layer_pieces[i]),
            params = param_rows(sp.layer_params[i]),
            pieces = piece_rows(sp.layer_pieces[i], sp.layer_params[i]),
            bases = bases, nbases = int(#c.bases * #sp.buffers),
            title = require("program").stage_title({ chunks = { st.chunks[i] } }),
            fwd = list_view(calls_of[c.vp].F, call_view),
            bwd = list_view(calls_of[c.vp].B, call_view),
            uses_mb = c.embedding or c.head,
        }
    end
    v.chunk_rows = aligned(ccells)
    local mcells, mnotes, unused = {}, {}, {}
    for _, m in ipairs(sp.mem) do
        if m.how == "NONE" then
            unused[#unused + 1] = m.id
        else
            mcells[#mcells + 1] = { "GPT_MEM_" .. m.how, m.alias and ("GPT_M_" .. m.alias) or "0",
                                    int(m.elems) }
            mnotes[#mnotes + 1] = m.what .. (m.how == "ALIAS" and "" or
                                  m.count > 1 and string.format(", x %d", m.count) or "")
            v.mem[#v.mem + 1] = { id = "GPT_M_" .. m.id }
        end
    end
    local w = 0
    for _, m in ipairs(v.mem) do w = math.max(w, #m.id) end
    local rows = aligned(mcells, mnotes, 4 + w + 5)
    for _, m in ipairs(v.mem) do w = math.max(w, #m.id) end
    for i, m in ipairs(v.mem) do
        m.id = "[" .. m.id .. "]" .. string.rep(" ", w - #m.id)
        m.has_above, m.above, m.line = rows[i].has_above, rows[i].above, rows[i].line
    end
    v.mem_unused = wrap(#unused > 0 and unused or { "none" }, 88)
    for i, o in ipairs(sp.schedule) do
        local ov = { section = o.kind == "SECTION", forward = o.kind == "F",
                     backward = o.kind == "B", text = o.text,
                     comment = comment(o.text, o.kind == "X" and 8 or 4) }
        if o.kind == "F" or o.kind == "B" then
            ov.chunk, ov.mb, ov.slot = int(o.chunk), int(o.mb), int(o.slot)
        elseif o.kind == "X" then
            ov.p2p = list_view(o.p2p, function(m)
                local buf
                if m.what == "act" and m.send then
                    buf = string.format("gpt_chunk_output(%d, %d)", m.chunk, m.slot)
                else
                    buf = string.format("gpt.chunk[%d].acts[%d].%s", m.chunk, m.slot,
                                        m.what == "act" and "x" or "dy")
                end
                return { send = flag(m.send), buf = buf, peer = "gpt.pp_" .. m.dir,
                         tag = "GPT_TAG_" .. m.tag }
            end)
            ov.nops = int(#o.p2p)
        end
        v.schedule[i] = ov
    end
    for i, o in ipairs(sp.tail) do
        local ov = { comment = comment(o.text, 4), group = o.group and group_expr(o.group),
                     buf = o.buf and int(o.buf), bucket = o.bucket and int(o.bucket),
                     offset = o.offset and int(o.offset), n = o.n and int(o.n),
                     which = o.which and int(o.which) }
        for _, kind in ipairs(TAIL_KINDS) do ov[kind:lower()] = o.kind == kind end
        v.tail[i] = ov
    end
    return v
end

local function render_program(cfg, topo, part, prog, files, opts)
    local ropts = { line_dirs = opts and opts.line_dirs or false }
    local function add(name, template, env, what)
        files[#files + 1] = ir.File { name = name, text = tmpl.render(template, env, ropts),
                                      what = what }
    end
    local T = "templates/program/"
    local stages = {}
    for i, sp in ipairs(prog.stages) do stages[i] = { cname = "stage" .. sp.stage, title = sp.title } end
    add("model.h", T .. "model.h.tmpl",
        { banner = banner(cfg, T .. "model.h.tmpl"), consts = const_view(prog.consts),
          stages = stages }, "every size of the layout as a named constant; the stages")
    local rcells = {}
    for i, r in ipairs(prog.roles) do
        rcells[i] = { '"' .. r.name .. '"', "GPT_" .. r.scope, int(r.rows), int(r.cols),
                      int(r.ndim), "GPT_INIT_" .. r.init, cfloat(r.std) }
    end
    local roles = aligned(rcells)
    local AX = { tp = "TP", cp = "CP", ep = "EP", dp = "DP", pp = "PP" }
    local gcells, gnotes = {}, {}
    for i, g in ipairs(prog.groups) do
        local mask = {}
        for _, a in ipairs(g.axes) do mask[#mask + 1] = "1u << GPT_AX_" .. AX[a] end
        gcells[i] = { "GPT_GRP_" .. g.id, "GPT_GRID_" .. g.grid,
                      #mask > 0 and table.concat(mask, " | ") or "0", flag(g.create) }
        gnotes[i] = string.format("%s, %d ranks: %s%s", g.kind, g.size, g.comment,
                                  g.create and "" or " (not created)")
    end
    local groups = aligned(gcells, gnotes)
    local function grid(ga)
        local sz, sd = {}, {}
        for i = 1, #ga.size do sz[i], sd[i] = int(ga.size[i]), int(ga.stride[i]) end
        return { size = table.concat(sz, ", "), stride = table.concat(sd, ", ") }
    end
    add("program.c", T .. "program.c.tmpl",
        { banner = banner(cfg, T .. "program.c.tmpl"), model = cfg.model.file,
          run_hint = cfg.world > 1 and string.format("under mpirun -np %d", cfg.world)
                     or "one rank: run it directly",
          moe = cfg.model.moe ~= nil, roles = roles, nroles = int(#prog.roles),
          dense = grid(prog.dense), expert = grid(prog.expert), groups = groups,
          ngroups = int(#prog.groups), stages = stages },
        "main: the model's tensors, the rank grid and groups, the stages; the library runs them")
    for _, sp in ipairs(prog.stages) do
        local tmpl_name = T .. "stage.c.tmpl"
        add("stage" .. sp.stage .. ".c", tmpl_name,
            { banner = banner(cfg, tmpl_name, { sp.title, "run by ranks " .. sp.ranks ..
                  string.format("; %s schedule: %d warm-up, %d steady, %d cool-down; %d in " ..
                                "flight", prog.schedule_kind, sp.warmup, sp.steady,
                                sp.cooldown, sp.inflight) }),
              s = stage_view(cfg, prog, sp, part) },
            "stage " .. sp.stage .. " program: " .. sp.title:gsub("^stage %d+ of %d+: ", ""))
    end
    local sources = { "program.c" }
    for _, sp in ipairs(prog.stages) do sources[#sources + 1] = "stage" .. sp.stage .. ".c" end
    add("build.mk", T .. "build.mk.tmpl",
        { sources = sources, regen = cfg.make }, "make rules for train and train_cuda")
end

-- Every output file, rendered. The MANIFEST comes last and lists the others. 'prog' (from
-- program.build) adds the training program's sources; without it only the build-time picture.
function M.render(cfg, topo, part, sh, sched, prog, opts)
    local files = {
        ir.File { name = "topology.json", text = M.topology_json(cfg, topo, part),
                  what = "rank groups of every kind; coordinates, layers, duties of every rank" },
        ir.File { name = "shards.json", text = M.shards_json(cfg, sh),
                  what = "parameter pieces per rank class, rank -> class, buffer layout, bytes" },
        ir.File { name = "report.txt", text = inspect.summary(cfg, topo, part, sh, sched, prog),
                  what = "all ranks by stage, parameter counts, memory per rank (make inspect)" },
        ir.File { name = "schedule.svg", text = schedule_svg(cfg, topo, sched),
                  what = "the pipeline schedule drawn: stages x time, F and B per micro-batch" },
    }
    if prog then render_program(cfg, topo, part, prog, files, opts) end
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
