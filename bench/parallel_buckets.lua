-- bench/parallel_buckets.lua: the gradient buckets of class 0 (rank 0's: PP 1) in an emitted
-- shards.json, for bench/parallel_bench.sh; not a test and not used by the generator. Each
-- bucket is one data-parallel all-reduce (or reduce-scatter and all-gather with the distributed
-- optimizer) per step, and the runtime's algorithm rounds per call, so the bench needs every
-- bucket's size, not their sum.
-- Run: build/gen --lua bench/parallel_buckets.lua SHARDS.json
-- Prints one line per bucket, in buffer then bucket order:
--   bucket <chunk> <start> <size> <dp shards>     (elements)
local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
local T = require("harness")("parallel_buckets")

local path = assert(arg and arg[1], "usage: parallel_buckets.lua shards.json")
local f = assert(io.open(path, "rb"))
local doc = T.json(f:read("a"))
f:close()

for _, cls in ipairs(doc.map.classes) do
    if cls.map.id == 0 then
        for _, b in ipairs(cls.map.buffers) do
            for _, bk in ipairs(b.map.buckets) do
                print(string.format("bucket %d %d %d %d", b.map.chunk, bk.map.start,
                                    bk.map.size, b.map.dp_shards))
            end
        end
    end
end
