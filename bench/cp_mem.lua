-- bench/cp_mem.lua: one stage's memory plan (build/gen --dump memory), as bench/cp_bench.sh
-- tabulates it; not a test and not used by the generator.
-- Run: build/gen --lua bench/cp_mem.lua MEMORY.json     (one pipeline stage: PP 1)
-- Prints one line of bytes per rank on the CPU backend (the plan the program checks at start:
-- "memory: planned P bytes"):
--   ACTIVATIONS COMMUNICATION WORKSPACE STATE TOTAL
-- STATE = parameters + main parameters + gradients + optimizer state (what CP does not divide),
-- WORKSPACE includes the recompute workspace; TOTAL is the plan's peak_bytes.
local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
local T = require("harness")("cp_mem")

local f = assert(io.open(arg[1], "rb"))
local stages = T.json(f:read("a"))
f:close()
if #stages ~= 1 then
    io.stderr:write("cp_mem.lua: " .. #stages .. " pipeline stages; this helper reads PP 1 only\n")
    os.exit(1)
end

local m = stages[1].map
local state = m.parameters + m.main_parameters + m.gradients + m.optimizer_state
print(string.format("%d %d %d %d %d", m.activations.map.bytes, m.communication,
                    m.workspace + m.recompute_workspace, state, m.peak_bytes))
