-- raise.lua: raises the error object named by arg[1], through the host's reporting path
-- (run: build/gen --lua THIS KIND). suite.sh checks what gen prints and its exit status.
local kind = arg[1]
local function boom()
    error("boom")   -- a string: a generator bug
end
if kind == "located" then
    error({ file = "models/tiny.lua", line = 7,
                 msg = "'n_head' (12) must divide 'channels' (100)" }, 0)
elseif kind == "list" then
    error({ errors = {
        { file = "models/tiny.lua", line = 3.0, msg = "first problem" },
        { file = "models/tiny.lua", msg = "second problem (no line)" },
        { msg = "third problem (no file)" },
    } }, 0)
elseif kind == "nofile" then
    error({ msg = "--tp 3 does not divide 64 heads" }, 0)
elseif kind == "caret" then
    error({ file = "models/x.lua", line = 2, col = 5, source = "n = 12.5",
            msg = "not an integer" }, 0)
elseif kind == "string" then
    boom()
elseif kind == "table" then
    error({ message = "typo: not msg" })
elseif kind == "tostring" then
    error(setmetatable({}, { __tostring = function() return "custom object" end }))
elseif kind == "empty-list" then
    error({ errors = {} }, 0)
elseif kind == "nomem" then
    local host = require("host")
    host.mem_limit(host.mem_used() + 4 * 1024 * 1024)
    local t = {}
    for i = 1, 1e8 do t[i] = i end
end
print("no error raised for " .. tostring(kind))
