-- tests/program/sites_check.lua: every communication call of a rank's training steps is a line
-- of its generated stage source -- the rank's stage<k>.c, at a line that names the rt_ call the
-- trace recorded (rt_allreduce for an all-reduce, rt_reduce_scatter_start for a started
-- reduce-scatter, rt_p2p for pipeline messages, rt_wait for a wait, ...). The sites come from
-- the runtime's trace with RT_TRACE_SITES=1 (" at train+0x<offset>": the return address of the
-- call), mapped to file:line by addr2line on the program's executable (built with -g).
-- Run: build/gen --lua tests/program/sites_check.lua PROGRAM.json TRACE_DIR WORLD OUT_DIR
-- (OUT_DIR: the generated directory with train and stage<k>.c). The first STARTUP lines of
-- each trace are the library's start-up checks (lib/faults.c, lib/data.c), not steps.
-- Prints "ok <lines> lines, <sites> sites, all in the stage sources" or the first line that is
-- not (exit 1).
local host = require("host")
package.path = host.root() .. "/tests/lua/?.lua;" .. package.path
local T = require("harness")("sites")

local STARTUP = 3

local f = assert(io.open(arg[1], "rb"))
local prog = T.json(f:read("a"))
f:close()
local dir, world, out = arg[2], tonumber(arg[3]), arg[4]
local dense = prog.map.dense
local pp_size, pp_stride = dense.map.size[5], dense.map.stride[5]

-- the rt_ function a trace line's call must name
local function callee(line)
    local op = line:match("^(%S+)")
    if op == "wait" then return "rt_wait" end
    if line:match(" start %d+$") then return "rt_" .. op .. "_start" end
    return "rt_" .. op
end

-- every rank's lines past start-up: { text, site offset }
local lines, offsets, seen = {}, {}, {}
for rank = 0, world - 1 do
    local n = 0
    for l in io.lines(string.format("%s/rank_%05d.trace", dir, rank)) do
        n = n + 1
        l = l:gsub(" t=[%d.]+$", "")
        local text, obj, off = l:match("^(.-) at ([^+ ]+)%+0x(%x+)$")
        if not text then
            print(string.format("rank %d line %d has no call site (RT_TRACE_SITES=1?): %s",
                                rank, n, l))
            os.exit(1)
        end
        if n > STARTUP then
            if obj ~= "train" then
                print(string.format("rank %d line %d: '%s' is called from %s, not the program",
                                    rank, n, text, obj))
                os.exit(1)
            end
            lines[#lines + 1] = { rank = rank, n = n, text = text, off = tonumber(off, 16) }
            if not seen[off] then
                seen[off] = true
                offsets[#offsets + 1] = tonumber(off, 16)
            end
        end
    end
end

-- addr2line: the source line of each call (the return address minus one)
local args = {}
for i, o in ipairs(offsets) do args[i] = string.format("0x%x", o - 1) end
local where = {}
local p = assert(io.popen(string.format("addr2line -e '%s/train' %s", out,
                                        table.concat(args, " "))))
local i = 0
for l in p:lines() do
    i = i + 1
    where[offsets[i]] = l
end
p:close()
assert(i == #offsets, "addr2line gave " .. i .. " lines for " .. #offsets .. " addresses")

local source = {}   -- stage<k>.c's lines
local function src(file)
    if not source[file] then
        source[file] = {}
        for l in io.lines(out .. "/" .. file) do source[file][#source[file] + 1] = l end
    end
    return source[file]
end

for _, l in ipairs(lines) do
    local k = (l.rank // pp_stride) % pp_size
    local file, ln = where[l.off]:match("([^/]+):(%d+)")
    local want = string.format("stage%d.c", k)
    if file ~= want then
        print(string.format("rank %d line %d: '%s' is called at %s, not in %s", l.rank, l.n,
                            l.text, where[l.off], want))
        os.exit(1)
    end
    local code = src(file)[tonumber(ln)] or ""
    local fn = callee(l.text)
    if not code:find(fn .. "(", 1, true) then
        print(string.format("rank %d line %d: '%s' maps to %s:%s, which does not call %s: %s",
                            l.rank, l.n, l.text, file, ln, fn, code))
        os.exit(1)
    end
end
print(string.format("ok %d lines, %d sites, all in the stage sources", #lines, #offsets))
