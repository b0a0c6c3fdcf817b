-- tests/pipeline/tied.lua: the two copies of the tied embedding after training (docs/megatron.md
-- §7): on every pipeline group the last stage's wte (the head's copy) must equal the
-- first stage's bit for bit, and the first stage's must be what --save wrote.
-- Run: build/gen --lua tests/pipeline/tied.lua OUTDIR CKPT_STEP_DIR SAVED.safetensors
--   OUTDIR         the generated directory (shards.json, topology.json: buffer layout, ranks)
--   CKPT_STEP_DIR  a resume checkpoint of an f32 program (rank_NNNNN.bin: header and texts
--                  (lib/ckpt.c), then the state, its last nbytes: per buffer params, first and
--                  second moments)
-- Prints one line; exits 1 on a difference.

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
local J = require("harness")("tied").json

local outdir, ckpt, saved = arg[1], arg[2], arg[3]
local function die(fmt, ...)
    print(string.format(fmt, ...))
    os.exit(1)
end
local function slurp(path)
    local f = io.open(path, "rb")
    if not f then die("cannot open %s", path) end
    local s = f:read("a")
    f:close()
    return s
end

local shards = J(slurp(outdir .. "/shards.json"))
local topo = J(slurp(outdir .. "/topology.json"))
local P = topo.map.sizes.map.pp
local V = topo.map.sizes.map.vp
if P < 2 then die("PP = 1: no tied copy to check") end

-- The wte of 'rank' from its checkpoint file: {floats = string, rows =, cols =, tied =}.
local function wte_of(rank)
    -- the rank's class: the one with its (pp, tp, ep, etp) coordinates (topology.json; a
    -- dense model's classes have ep = etp = 0)
    local co = topo.map.ranks[rank + 1].map
    local dense = shards.map.unique_expert == 0
    local cls
    for _, c in ipairs(shards.map.classes) do
        local m = c.map
        if m.pp == co.pp and m.tp == co.tp and (dense or m.ep == co.ep and m.etp == co.etp) then
            cls = m
        end
    end
    if not cls then die("rank %d: no class with its coordinates", rank) end
    local data = slurp(string.format("%s/rank_%05d.bin", ckpt, rank))
    local nbytes = string.unpack("<I8", data, 33)       -- magic, world, stage, step, nbytes
    -- the state is the file's last nbytes, after the header (and from version 4 its texts)
    local hsize = #data - nbytes
    -- the moments are whole buffers, or dp shards with the distributed optimizer
    local whole, sharded = 0, 0
    for _, b in ipairs(cls.buffers) do
        whole = whole + 4 * 3 * b.map.size
        sharded = sharded + 4 * (b.map.size + 2 * b.map.shard)
    end
    local dist = nbytes ~= whole
    if dist and nbytes ~= sharded then die("rank %d: %d bytes, layout says %d", rank, nbytes,
                                           whole) end
    local param
    for _, p in ipairs(cls.params) do
        if p.map.name == "wte.weight" then param = p.map end
    end
    if not param then return nil end
    local base = 0
    for _, b in ipairs(cls.buffers) do
        for _, bk in ipairs(b.map.buckets) do
            for _, s in ipairs(bk.map.slots) do
                if s.map.name == "wte.weight" then
                    local at = hsize + base + 4 * s.map.offset
                    return { floats = data:sub(at + 1, at + 4 * s.map.numel),
                             rows = param.local_shape[1], cols = param.local_shape[2],
                             tied = param.tied, start = param.pieces[1] and
                                 param.pieces[1].map.start[1] or 0,
                             valid = param.pieces[1] and param.pieces[1].map.size[1] or 0 }
                end
            end
        end
        base = base + 4 * (b.map.size + 2 * (dist and b.map.shard or b.map.size))
    end
    die("rank %d: wte.weight is in no buffer", rank)
end

-- wte as saved: the tensor's bytes.
local st = slurp(saved)
local hn = string.unpack("<I8", st)
local header = st:sub(9, 8 + hn)
local a, b = header:match('"wte.weight":%s*{[^}]*"data_offsets":%s*%[(%d+),%s*(%d+)%]')
if not a then die("%s has no wte.weight", saved) end
local saved_wte = st:sub(8 + hn + tonumber(a) + 1, 8 + hn + tonumber(b))

-- every pipeline group: first and last stage ranks with equal tp, dp, cp
local by = {}
for _, r in ipairs(topo.map.ranks) do
    local m = r.map
    local k = m.tp .. "/" .. m.dp .. "/" .. m.cp
    by[k] = by[k] or {}
    by[k][m.pp] = m.rank
end
local pairs_checked, rows_saved = 0, 0
local keys = {}
for k in pairs(by) do keys[#keys + 1] = k end
table.sort(keys)
for _, k in ipairs(keys) do
    local first, last = by[k][0], by[k][P - 1]
    local e, h = wte_of(first), wte_of(last)
    if not (e and h) then die("group %s: wte missing on rank %d or %d", k, first, last) end
    if e.tied or not h.tied then die("group %s: the tied flag is on the wrong copy", k) end
    if e.floats ~= h.floats then
        local n = #e.floats // 4
        for i = 0, n - 1 do
            local x = string.unpack("<f", e.floats, 4 * i + 1)
            local y = string.unpack("<f", h.floats, 4 * i + 1)
            if x ~= y then
                die("tp/dp/cp %s: wte[%d] is %.9g on rank %d (first stage) but %.9g on rank " ..
                    "%d (last stage)", k, i, x, first, y, last)
            end
        end
    end
    -- the first stage's rows are what --save wrote (rows start..start+valid of the tensor)
    local cols = e.cols
    local want = saved_wte:sub(4 * e.start * cols + 1, 4 * (e.start + e.valid) * cols)
    if e.floats:sub(1, 4 * e.valid * cols) ~= want then
        die("tp/dp/cp %s: rank %d's wte rows %d..%d differ from %s", k, first, e.start,
            e.start + e.valid - 1, saved)
    end
    rows_saved = rows_saved + e.valid
    pairs_checked = pairs_checked + 1
end
print(string.format("wte: %d first/last stage pair(s) bit-identical over %d chunk(s), %d saved " ..
                    "rows match", pairs_checked, V, rows_saved))
