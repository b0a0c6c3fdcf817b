-- tests/parallel/shards_check.lua: what tests/parallel/suite.sh needs to know about an emitted
-- shards.json (run: build/gen --lua tests/parallel/shards_check.lua FILE). For every buffer of
-- every class prints
--   buffer <class> <chunk> numel <n> size <s> dp <d>
-- and, for every parameter that crosses a boundary between two data-parallel shards of a
-- bucket (the distributed optimizer then updates it on two ranks),
--   straddle <class> <name> [<offset>, <offset+numel>) boundary <b>
-- Reads the file only; independent of shards.lua (it recomputes the shard boundaries).

local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
local T = require("harness")("parallel")

local path = assert(arg and arg[1], "usage: shards_check.lua shards.json")
local f = assert(io.open(path, "rb"))
local doc = T.json(f:read("a"))
f:close()

for _, cls in ipairs(doc.map.classes) do
    local id = cls.map.id
    for _, b in ipairs(cls.map.buffers) do
        local dp = b.map.dp_shards
        print(string.format("buffer %d %d numel %d size %d dp %d", id, b.map.chunk, b.map.numel,
                            b.map.size, dp))
        for _, bk in ipairs(b.map.buckets) do
            local start, size = bk.map.start, bk.map.size
            assert(size % dp == 0, "bucket size not divisible by dp")
            local shard = size // dp
            for _, s in ipairs(bk.map.slots) do
                local lo, hi = s.map.offset, s.map.offset + s.map.numel
                for d = 1, dp - 1 do
                    local edge = start + d * shard
                    if lo < edge and edge < hi then
                        print(string.format("straddle %d %s [%d, %d) boundary %d", id,
                                            s.map.name, lo, hi, edge))
                    end
                end
            end
        end
    end
end
