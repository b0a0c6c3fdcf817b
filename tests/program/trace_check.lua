-- tests/program/trace_check.lua: what a program really communicates (the runtime's trace,
-- RT_TRACE) is what the generator declared (build/gen --dump program): every collective of
-- every library call and of the step's tail, and every pipeline message, in order, with the
-- same group, count and type, for every step, on every rank.
-- Run: build/gen --lua tests/program/trace_check.lua PROGRAM.json TRACE_DIR WORLD STEPS
-- The trace of a rank is the start-up's all-reduces (lib/faults.c, lib/data.c), then STEPS
-- times the step's list. Prints "ok <lines compared>" or the first difference (exit 1).
-- Asynchronous calls (runtime/rt.h "Trace"): a start's line ("<call> start <id>") stands for
-- its call in the order; a wait ("wait <id> <op> [<group>]") must name a request started
-- before it with that op and group, not waited yet, and is then left out (the declaration
-- says which calls a step makes and in what order, not where they are waited); every start
-- must be waited. " at <site>" and " t=<seconds>" at the end of a line (RT_TRACE_SITES=1,
-- RT_TRACE_TIMES=1) are ignored (tests/program/sites_check.lua reads the sites).
local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
local T = require("harness")("trace")

local f = assert(io.open(arg[1], "rb"))
local prog = T.json(f:read("a"))
f:close()
local dir, world, steps = arg[2], tonumber(arg[3]), tonumber(arg[4])

local function get(obj, key) return obj.map[key] end

-- pp and cp axes of the dense grid (ORDER GPT_AXIS: tp cp ep dp pp)
local dense = get(prog, "dense")
local pp_size, pp_stride = get(dense, "size")[5], get(dense, "stride")[5]
local cp_size, cp_stride = get(dense, "size")[2], get(dense, "stride")[2]

-- One hop of the cp ring as gen/lua/layer.lua ring_hop posts it: K|V (tag 2) then dK|dV (tag 3) to
-- the next cp rank, then the same from the previous one.
local function ring_line(c, rank)
    local n, dtype, n2 = get(c, "n"), get(c, "dtype"), get(c, "n2")
    local r = (rank // cp_stride) % cp_size
    local next = rank + ((r + 1) % cp_size - r) * cp_stride
    local prev = rank + ((r + cp_size - 1) % cp_size - r) * cp_stride
    local parts = { "p2p" }
    for _, dir in ipairs({ { "send", next }, { "recv", prev } }) do
        local what, peer = dir[1], dir[2]
        if n > 0 then parts[#parts + 1] = string.format("%s %d %d %s 2", what, peer, n, dtype) end
        if n2 then parts[#parts + 1] = string.format("%s %d %d f32 3", what, peer, n2) end
    end
    return table.concat(parts, " ")
end

local function coll_line(c, rank)
    local op, group, n, dtype, red = get(c, "op"), get(c, "group"), get(c, "n"), get(c, "dtype"),
                                     get(c, "red")
    if op == "ring" then return ring_line(c, rank) end
    if op == "alltoallv" then return string.format("alltoallv %s %s", group, dtype) end
    if red then return string.format("%s %s %d %s %s", op, group, n, dtype, red) end
    return string.format("%s %s %d %s", op, group, n, dtype)
end

-- The lines one step of 'rank' must trace.
local function expected(rank)
    local k = (rank // pp_stride) % pp_size
    local sp = get(prog, "stages")[k + 1]
    local out = {}
    local function colls(op)
        for _, c in ipairs(get(op, "comm")) do out[#out + 1] = coll_line(c, rank) end
    end
    for _, op in ipairs(get(sp, "schedule")) do
        local kind = get(op, "kind")
        if kind == "F" or kind == "B" then
            colls(op)
        elseif kind == "X" then
            local parts = { "p2p" }
            for _, m in ipairs(get(op, "p2p")) do
                local peer_stage = get(m, "peer")
                local peer = rank + (peer_stage - k) * pp_stride
                parts[#parts + 1] = string.format("%s %d %d %s %d", get(m, "send") and "send" or
                                                  "recv", peer, get(m, "n"), get(m, "dtype"),
                                                  get(m, "tag") == "ACT" and 0 or 1)
            end
            out[#out + 1] = table.concat(parts, " ")
        end
    end
    for _, op in ipairs(get(sp, "tail")) do colls(op) end
    return out
end

-- A rank's trace as the calls it made, in order (see the header); nil and a message when a
-- wait does not match a start.
local function read_trace(path)
    local lines, started = {}, {}
    local n = 0
    for l in io.lines(path) do
        n = n + 1
        l = l:gsub(" t=[%d.]+$", ""):gsub(" at %S+$", "")
        local id, op, group = l:match("^wait (%d+) (%S+) ?(%S*)$")
        if id then
            local s = started[id]
            if not s then
                return nil, string.format("line %d: '%s' waits for no pending start", n, l)
            end
            local sop, sgroup = s.line:match("^(%S+) ?(%S*)")
            if sop ~= op or (op ~= "p2p" and sgroup ~= group) then
                return nil, string.format("line %d: '%s' waits for '%s' (line %d)", n, l, s.line,
                                          s.at)
            end
            started[id] = nil
        else
            local call, sid = l:match("^(.-) start (%d+)$")
            if call then
                if started[sid] then
                    return nil, string.format("line %d: request %s started twice", n, sid)
                end
                started[sid] = { line = call, at = n }
                l = call
            end
            lines[#lines + 1] = l
        end
    end
    local first
    for id, s in pairs(started) do     -- the earliest, whatever the order pairs gives
        if not first or s.at < first.at then first = { id = id, line = s.line, at = s.at } end
    end
    if first then
        return nil, string.format("request %s ('%s', line %d) is never waited", first.id,
                                  first.line, first.at)
    end
    return lines
end

local compared, bad = 0, 0
for rank = 0, world - 1 do
    local path = string.format("%s/rank_%05d.trace", dir, rank)
    local lines, why = read_trace(path)
    if not lines then
        print(string.format("rank %d: %s", rank, why))
        os.exit(1)
    end
    -- start-up (lib/faults.c, lib/data.c): the checkpoint size summed and the outputs'
    -- verdict (lib_check_outputs), then the first bad token position (lib_tokens_open)
    local want = { "allreduce world 1 i64 sum", "allreduce world 1 i64 max",
                   "allreduce world 1 i64 max" }
    local step = expected(rank)
    for _ = 1, steps do
        for _, l in ipairs(step) do want[#want + 1] = l end
    end
    for i = 1, math.max(#want, #lines) do
        compared = compared + 1
        if want[i] ~= lines[i] then
            print(string.format("rank %d, line %d: traced '%s', declared '%s'", rank, i,
                                lines[i] or "(nothing)", want[i] or "(nothing)"))
            bad = bad + 1
            break
        end
    end
end
if bad > 0 then os.exit(1) end
print("ok " .. compared)
