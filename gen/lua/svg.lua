-- svg.lua: the pipeline schedule as a picture (schedule.svg) and its simple time model.
--
-- svg.timeline(sched) simulates the unrolled schedules of schedule.build with a forward of one
-- chunk costing 1 unit, a backward 2 units, and communication instantaneous but blocking as
-- the transport is (verify.lua): a batched exchange completes when each of its operations has
-- met its partner, at the later of the two posting times. It returns every compute box with
-- its start and end and the makespan; the idle share it implies is the simulated bubble.
-- svg.render(sched, opts) draws that timeline: one row per stage, one column per time unit,
-- an F or B box per (micro-batch, chunk), filled with the micro-batch's colour; with
-- opts.comm, under each row a communication lane: each data-parallel collective in flight, from
-- where the code starts it to where it is waited.
-- Pure: returns tables and text; emit.lua writes the file, inspect.lua prints the numbers.

local schedule = require("schedule")

local M = {}

M.COST = { F = 1, B = 2 }

--[[
** The pipeline's message channels of a simulation of P stages: post(r, st, t) posts the
** operations of stage r's exchange step st at time t and returns them, one item each; an item
** gets done = the later of the two posting times once its partner is posted (operations meet
** in posting order, per channel: source, destination and what). plan.shared_timeline's too.
]]
function M.channels(P)
    local queues = {}
    return function(r, st, t)
        local items = {}
        for _, op in ipairs(st.ops) do
            local peer = schedule.peer(P, r, op.dir)
            local k = op.send and (r .. ">" .. peer .. ":" .. op.what)
                      or (peer .. ">" .. r .. ":" .. op.what)
            local q = queues[k] or { sends = {}, recvs = {} }
            queues[k] = q
            local item = { posted = t }
            items[#items + 1] = item
            if op.send then q.sends[#q.sends + 1] = item else q.recvs[#q.recvs + 1] = item end
            while #q.sends > 0 and #q.recvs > 0 do
                local s, rv = table.remove(q.sends, 1), table.remove(q.recvs, 1)
                local done = math.max(s.posted, rv.posted)
                s.done, rv.done = done, done
            end
        end
        return items
    end
end

-- Call advance(r) for every stage r in turn until none of them moves (advance returns true
-- when stage r took a step or posted one).
function M.settle(P, advance)
    local progress = true
    while progress do
        progress = false
        for r = 0, P - 1 do
            if advance(r) then progress = true end
        end
    end
end

--[[
** Simulate sched.stages[1..P] (steps F, B, X; collective steps C are ignored). 'cost': the
** time of an F and a B ({F =, B =}), or a function (stage, kind, chunk) -> time. Returns
** {makespan =, busy =, stages = {[r] = {boxes = {{kind, mb, chunk, t0, t1}...}, finish =}}}.
** Raises an internal error if the schedule cannot finish (verify.check rejects those first).
]]
function M.timeline(sched, cost)
    cost = cost or M.COST
    local P = sched.P
    local pc, clock, pending, out = {}, {}, {}, {}
    for r = 0, P - 1 do
        pc[r], clock[r], out[r] = 1, 0, { boxes = {}, finish = 0 }
    end
    local post = M.channels(P)
    local function advance(r)
        local steps, moved = sched.stages[r + 1].steps, false
        while pc[r] <= #steps do
            local st = steps[pc[r]]
            if st.kind == "F" or st.kind == "B" then
                local t0 = clock[r]
                clock[r] = t0 + (type(cost) == "function" and cost(r, st.kind, st.chunk)
                                 or cost[st.kind])
                local b = out[r].boxes
                b[#b + 1] = { kind = st.kind, mb = st.mb, chunk = st.chunk, t0 = t0, t1 = clock[r] }
            elseif st.kind == "X" then
                if not pending[r] then pending[r] = post(r, st, clock[r]) end
                local t = clock[r]
                for _, item in ipairs(pending[r]) do
                    if not item.done then return moved end
                    t = math.max(t, item.done)
                end
                clock[r], pending[r] = t, nil
            end
            pc[r] = pc[r] + 1
            moved = true
        end
        return moved
    end
    M.settle(P, advance)
    local makespan, busy = 0, 0
    for r = 0, P - 1 do
        assert(pc[r] > #sched.stages[r + 1].steps, "svg.timeline: the schedule does not finish")
        out[r].finish = clock[r]
        makespan = math.max(makespan, clock[r])
    end
    for _, b in ipairs(out[0].boxes) do busy = busy + (b.t1 - b.t0) end
    return { makespan = makespan, busy = busy, stages = out }
end

-- Idle time over compute time of the simulated schedule, (makespan - busy) / busy: for
-- 1F1B this is Megatron's (P-1)/M bubble when every stage computes alike.
function M.bubble(tl)
    return (tl.makespan - tl.busy) / tl.busy
end

-- -- Drawing -------------------------------------------------------------------------------

-- Colour of micro-batch mb: hues spaced by the golden angle, so neighbours differ.
local function hue(mb) return (mb * 137) % 360 end

local function esc(s)
    return (s:gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;"):gsub('"', "&quot;"))
end

-- Where, in stage r's timeline, a point inside a box lies: { kind, mb, chunk, frac } -> time.
local function at_time(boxes, p)
    for _, b in ipairs(boxes) do
        if b.kind == p.kind and b.mb == p.mb and b.chunk == p.chunk then
            return b.t0 + p.frac * (b.t1 - b.t0)
        end
    end
end

--[[
** The SVG text of sched's timeline. opts.labels[r]: the row label of stage r (default
** "stage r"); opts.title: a line above the picture; opts.note: a line below it; opts.comm[r]:
** stage r's collectives in flight, each { kind = "reduce" (started at 'at', waited after the
** schedule) | "gather" (started after the previous step's optimizer, waited at 'at'), at = {
** kind, mb, chunk, frac: the point inside that box }, text }.
]]
function M.render(sched, opts)
    opts = opts or {}
    local tl = M.timeline(sched)
    local P, V = sched.P, sched.V
    local span = math.max(tl.makespan, 1)
    -- a unit is 10..28 pixels wide, the picture about 1600 pixels at most
    local unit = math.max(10, math.min(28, 1600 // span))
    local lane = 0
    for r = 0, P - 1 do
        if opts.comm and opts.comm[r] and #opts.comm[r] > 0 then lane = 8 end
    end
    local row, gap, top = 26, 6 + lane, 44
    local left = 0
    for r = 0, P - 1 do
        left = math.max(left, #(opts.labels and opts.labels[r] or ("stage " .. r)))
    end
    left = 24 + 7 * left         -- about 7 pixels a character at 11 pixels
    local width = left + span * unit + 20
    local height = top + P * (row + gap) + 56 + (lane > 0 and 18 or 0)
    local o = {}
    local function add(fmt, ...) o[#o + 1] = string.format(fmt, ...) end
    add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" ' ..
        'font-family="sans-serif" font-size="11">', width, height, width, height)
    add('<rect width="%d" height="%d" fill="white"/>', width, height)
    add('<text x="8" y="16" font-size="13" font-weight="bold">%s</text>',
        esc(opts.title or "pipeline schedule"))
    -- time axis: a tick every k units
    local k = 1
    while k * unit < 40 do k = k * 2 end
    for t = 0, span, k do
        local x = left + t * unit
        add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#dddddd"/>', x, top - 6, x,
            top + P * (row + gap) - gap)
        add('<text x="%d" y="%d" text-anchor="middle" fill="#666666">%d</text>', x, top - 10, t)
    end
    for r = 0, P - 1 do
        local y = top + r * (row + gap)
        local label = opts.labels and opts.labels[r] or ("stage " .. r)
        add('<text x="8" y="%d">%s</text>', y + row // 2 + 4, esc(label))
        for _, b in ipairs(tl.stages[r].boxes) do
            local x, w = left + b.t0 * unit, (b.t1 - b.t0) * unit
            local name = V > 1 and string.format("%s%d.%d", b.kind, b.mb, b.chunk)
                or string.format("%s%d", b.kind, b.mb)
            local light = b.kind == "F" and 78 or 48
            add('<g><title>%s: %s micro-batch %d, chunk %d, time %d-%d</title>', esc(label),
                b.kind == "F" and "forward" or "backward", b.mb, b.chunk, b.t0, b.t1)
            add('<rect x="%d" y="%d" width="%d" height="%d" fill="hsl(%d,70%%,%d%%)" ' ..
                'stroke="#333333" stroke-width="%s"/>', x, y, w, row, hue(b.mb), light,
                (V > 1 and b.chunk % 2 == 1) and "2" or "0.5")
            -- the label when it fits (about 6.5 pixels a character)
            if #name * 13 <= 2 * (w - 2) then
                add('<text x="%d" y="%d" text-anchor="middle" fill="%s">%s</text>', x + w // 2,
                    y + row // 2 + 4, b.kind == "F" and "#000000" or "#ffffff", name)
            end
            add("</g>")
        end
        -- the communication lane: a bar per collective in flight
        for _, c in ipairs(opts.comm and opts.comm[r] or {}) do
            local t = at_time(tl.stages[r].boxes, c.at)
            if t then
                local t0, t1 = t, tl.stages[r].finish
                if c.kind == "gather" then t0, t1 = 0, t end
                add('<g><title>%s: %s, time %.1f-%.1f</title>', esc(label), esc(c.text), t0, t1)
                add('<rect x="%d" y="%d" width="%d" height="5" fill="%s" fill-opacity="0.45"/>',
                    math.floor(left + t0 * unit), y + row + 2,
                    math.max(1, math.floor((t1 - t0) * unit)),
                    c.kind == "gather" and "#2060c0" or "#c04020")
                add("</g>")
            end
        end
    end
    local y = top + P * (row + gap) + 14
    add('<text x="8" y="%d" fill="#333333">F = forward of one chunk (1 unit), B = backward ' ..
        '(2 units), communication instantaneous; colour = micro-batch%s</text>', y,
        V > 1 and "; Fm.c = micro-batch m, local chunk c (odd chunks: thick border)" or "")
    add('<text x="8" y="%d" fill="#333333">makespan %d units for %d of compute per stage: ' ..
        'bubble %.3f (simulated)%s</text>', y + 18, tl.makespan, tl.busy, M.bubble(tl),
        opts.note and ("; " .. esc(opts.note)) or "")
    if lane > 0 then
        add('<text x="8" y="%d" fill="#333333">under each stage: its data-parallel ' ..
            'communication in flight -- red: a gradient bucket\'s reduction, from where the ' ..
            'backward starts it to the wait after the schedule; blue: a bucket\'s parameter ' ..
            'all-gather, from the previous step to its first use</text>', y + 36)
    end
    add("</svg>")
    return table.concat(o, "\n") .. "\n"
end

return M
