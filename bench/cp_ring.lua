-- bench/cp_ring.lua: the cp ring traffic a program declares (build/gen --dump program), for
-- bench/cp_bench.sh; not a test and not used by the generator. Each "ring" Coll record is one
-- hop of lib/model.c ring_hop: this rank sends n elements of K|V in the record's dtype (tag 2)
-- and, in the backward, n2 f32 elements of dK|dV (tag 3) to the next cp rank. With CP_COMM=a2a
-- there is no ring: each attention layer's exchanges are "alltoall" Coll records on the cp group
-- (rt_alltoall, equal blocks; "alltoallv" counted too), counted here.
-- Run: build/gen --lua bench/cp_ring.lua PROGRAM.json     (one pipeline stage: PP 1)
-- Prints, in bytes one rank sends:
--   step  FWD BWD TAG2 TAG3 HOPS   per step: the F and B schedule ops' ring records, the same
--                                  split by tag, and how many records (hops) there are
--   layer FWD BWD CALLS            per layer and micro-batch: one layer_fwd / layer_bwd call's
--                                  records (every call declares the same), CALLS = layer_fwd calls
--   grad BYTES                     per step: the gradients all-reduced over dp-cp (the cp ranks
--                                  are data-parallel replicas of the weights)
--   a2a F B FWD BWD                per step: the alltoall records on cp of the F and B schedule
--                                  ops; per layer and micro-batch: those of one layer_fwd /
--                                  layer_bwd call (every call declares the same); all 0 with
--                                  CP_COMM=p2p
local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
local T = require("harness")("cp_ring")

local f = assert(io.open(arg[1], "rb"))
local prog = T.json(f:read("a"))
f:close()

local function get(obj, key) return obj.map[key] end
local dtype_size = { f32 = 4, bf16 = 2 }

-- Bytes of one ring record: K|V, then dK|dV (always f32); nil if the record is no ring hop.
local function ring_bytes(c)
    if get(c, "op") ~= "ring" then return nil end
    local es = assert(dtype_size[get(c, "dtype")], "ring record of unknown dtype")
    local n2 = get(c, "n2") or 0
    return get(c, "n") * es, n2 * 4
end

local stages = get(prog, "stages")
if #stages ~= 1 then
    io.stderr:write("cp_ring.lua: " .. #stages .. " pipeline stages; this helper reads PP 1 only\n")
    os.exit(1)
end

local step = { F = 0, B = 0, tag2 = 0, tag3 = 0, hops = 0 }
local per_call = { layer_fwd = {}, layer_bwd = {} }   -- distinct bytes of one call -> true
local a2a_step = { F = 0, B = 0 }
local a2a_call = { layer_fwd = {}, layer_bwd = {} }   -- distinct record counts of one call -> true
local function is_a2a(c)
    local o = get(c, "op")
    return (o == "alltoall" or o == "alltoallv") and get(c, "group") == "cp"
end
local calls = 0
for _, op in ipairs(get(stages[1], "schedule")) do
    local kind = get(op, "kind")
    if kind == "F" or kind == "B" then
        for _, c in ipairs(get(op, "comm")) do
            local kv, dkv = ring_bytes(c)
            if kv then
                step[kind] = step[kind] + kv + dkv
                step.tag2, step.tag3, step.hops = step.tag2 + kv, step.tag3 + dkv, step.hops + 1
            end
            if is_a2a(c) then a2a_step[kind] = a2a_step[kind] + 1 end
        end
        for _, call in ipairs(get(op, "calls")) do
            local name = get(call, "op")
            if per_call[name] then
                local bytes, a2a = 0, 0
                for _, c in ipairs(get(call, "comm")) do
                    local kv, dkv = ring_bytes(c)
                    if kv then bytes = bytes + kv + dkv end
                    if is_a2a(c) then a2a = a2a + 1 end
                end
                per_call[name][bytes] = true
                a2a_call[name][a2a] = true
                if name == "layer_fwd" then calls = calls + 1 end
            end
        end
    end
end
-- nothing else in a step (the optimizer's tail) may travel on the ring
local grad = 0
for _, op in ipairs(get(stages[1], "tail")) do
    for _, c in ipairs(get(op, "comm")) do
        assert(not ring_bytes(c), "a ring record in the step's tail")
        assert(not is_a2a(c), "an alltoall record on cp in the step's tail")
        if get(c, "group") == "dp-cp" then
            grad = grad + get(c, "n") * assert(dtype_size[get(c, "dtype")], "unknown dtype")
        end
    end
end

-- the one value every call of 'name' declares (in 'tab': per_call, or a2a_call)
local function only(name, tab)
    local v, count = nil, 0
    for bytes in pairs((tab or per_call)[name]) do v, count = bytes, count + 1 end
    if count ~= 1 then
        io.stderr:write("cp_ring.lua: " .. name .. " calls declare " .. count ..
                        (tab and " different alltoall counts\n" or " different ring volumes\n"))
        os.exit(1)
    end
    return v
end

print(string.format("step %d %d %d %d %d", step.F, step.B, step.tag2, step.tag3, step.hops))
print(string.format("layer %d %d %d", only("layer_fwd"), only("layer_bwd"), calls))
print(string.format("grad %d", grad))
print(string.format("a2a %d %d %d %d", a2a_step.F, a2a_step.B, only("layer_fwd", a2a_call),
                    only("layer_bwd", a2a_call)))
