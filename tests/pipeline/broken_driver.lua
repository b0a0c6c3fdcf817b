-- tests/pipeline/broken_driver.lua: the real driver with a deliberately broken pipeline
-- schedule, to show end to end that build/gen refuses to emit it (tests/pipeline/suite.sh).
-- Run: build/gen --driver tests/pipeline/broken_driver.lua tiny --pp 4 --nmb 8 --out DIR
-- PIPELINE_BREAK picks the defect (default "swap"):
--   swap     stage 1 sends its activations, then receives the gradient, as two blocking
--            operations; stage 2 does the same with its gradient first: both wait in a send
--   missing  stage 2 loses the receive of its last output gradient
-- Product code is untouched: schedule.build is wrapped here, program.build calls it.

local schedule = require("schedule")

local real_build = schedule.build

-- The first exchange of stage 'st' that sends towards 'dir' and also receives.
local function combined(st, dir)
    for i, s in ipairs(st.steps) do
        if s.kind == "X" and #s.ops == 2 and s.ops[1].send ~= s.ops[2].send then
            local snd = s.ops[1].send and s.ops[1] or s.ops[2]
            if snd.dir == dir then return i end
        end
    end
    error("broken_driver: no combined exchange towards " .. dir)
end

local function send_first(st, i)
    local x = st.steps[i]
    local snd = x.ops[1].send and x.ops[1] or x.ops[2]
    local rcv = x.ops[1].send and x.ops[2] or x.ops[1]
    st.steps[i] = { kind = "X", ops = { snd }, phase = x.phase }
    table.insert(st.steps, i + 1, { kind = "X", ops = { rcv }, phase = x.phase })
end

schedule.build = function(P, V, Mb, N)
    local s = real_build(P, V, Mb, N)
    local how = os.getenv("PIPELINE_BREAK") or "swap"
    if how == "swap" then
        send_first(s.stages[2], combined(s.stages[2], "next"))
        send_first(s.stages[3], combined(s.stages[3], "prev"))
    elseif how == "missing" then
        local st = s.stages[3]
        for j = #st.steps, 1, -1 do
            local x = st.steps[j]
            if x.kind == "X" and #x.ops == 1 and not x.ops[1].send then
                table.remove(st.steps, j)
                break
            end
        end
    else
        error("broken_driver: unknown PIPELINE_BREAK=" .. how)
    end
    return s
end

return require("driver")
