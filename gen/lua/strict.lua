-- strict.lua: make undeclared globals an error in the generator's own Lua code.
-- Loaded first by driver.lua (and by tests). Reading or assigning a global that was not there
-- when this module loaded raises an error naming it; C code (the host) is exempt, as in the
-- classic etc/strict.lua. Model descriptions never see _G: they run in sandbox.lua's env.

local M = {}

local function from_c()
    local info = debug.getinfo(3, "S")
    return info ~= nil and info.what == "C"
end

local mt = getmetatable(_G) or {}

mt.__newindex = function(t, k, v)
    if not from_c() then
        error("assignment to undeclared global '" .. tostring(k) .. "' (use local)", 2)
    end
    rawset(t, k, v)
end

mt.__index = function(_, k)
    if not from_c() then
        error("undeclared global '" .. tostring(k) .. "'", 2)
    end
    return nil
end

setmetatable(_G, mt)

return M
