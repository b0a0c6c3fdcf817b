-- json.lua: deterministic JSON text for --dump and for the files emit.lua writes.
-- Objects are written in a fixed key order: the declared field order of ir.lua records, sorted
-- keys for plain tables (never pairs() order). Integers print as integers, floats with the
-- shortest of %.15g/%.16g/%.17g that reads back exactly. No decoder: the generator never
-- reads JSON.

local ir = require("ir")

local M = {}

local escapes = {
    ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
    ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t",
}

-- A JSON string literal for 's'.
function M.str(s)
    return '"' .. s:gsub('[%c"\\]', function(c)
        return escapes[c] or string.format("\\u%04x", c:byte())
    end) .. '"'
end

-- A JSON number for 'x'.
function M.num(x)
    if math.type(x) == "integer" then return string.format("%d", x) end
    if x ~= x or x == math.huge or x == -math.huge then
        error("json: cannot encode " .. tostring(x), 2)
    end
    for _, f in ipairs({ "%.15g", "%.16g", "%.17g" }) do
        local s = string.format(f, x)
        if tonumber(s) == x then return s end
    end
end

local function is_array(t)
    local n = #t
    if n == 0 then return next(t) == nil end
    local count = 0
    for _ in pairs(t) do count = count + 1 end
    return count == n
end

local function scalar(v)
    local ty = type(v)
    if v == nil then return "null"
    elseif ty == "boolean" then return v and "true" or "false"
    elseif ty == "number" then return M.num(v)
    elseif ty == "string" then return M.str(v)
    end
end

local function all_scalars(t)
    for i = 1, #t do
        if type(t[i]) == "table" then return false end
    end
    return true
end

local encode

local function encode_array(t, ind, out)
    if #t == 0 then out[#out + 1] = "[]"; return end
    if ind == nil then      -- one line
        out[#out + 1] = "["
        for i = 1, #t do
            if i > 1 then out[#out + 1] = ", " end
            encode(t[i], nil, out)
        end
        out[#out + 1] = "]"
        return
    end
    if all_scalars(t) then
        local parts = {}
        for i = 1, #t do parts[i] = scalar(t[i]) end
        out[#out + 1] = "[" .. table.concat(parts, ", ") .. "]"
        return
    end
    local inner = ind .. "  "
    out[#out + 1] = "[\n"
    for i = 1, #t do
        out[#out + 1] = inner
        encode(t[i], inner, out)
        out[#out + 1] = (i < #t) and ",\n" or "\n"
    end
    out[#out + 1] = ind .. "]"
end

local function encode_object(keys, t, ind, out, arrays)
    if #keys == 0 then out[#out + 1] = "{}"; return end
    if ind == nil then      -- one line
        out[#out + 1] = "{"
        for i, k in ipairs(keys) do
            out[#out + 1] = (i > 1 and ", " or "") .. M.str(k) .. ": "
            local v = t[k]
            if arrays and arrays[k] and type(v) == "table" then
                encode_array(v, nil, out)
            else
                encode(v, nil, out)
            end
        end
        out[#out + 1] = "}"
        return
    end
    local inner = ind .. "  "
    out[#out + 1] = "{\n"
    for i, k in ipairs(keys) do
        out[#out + 1] = inner .. M.str(k) .. ": "
        local v = t[k]
        if arrays and arrays[k] and type(v) == "table" then
            encode_array(v, inner, out)
        else
            encode(v, inner, out)
        end
        out[#out + 1] = (i < #keys) and ",\n" or "\n"
    end
    out[#out + 1] = ind .. "}"
end

encode = function(v, ind, out)
    local s = scalar(v)
    if s then out[#out + 1] = s; return end
    if type(v) ~= "table" then error("json: cannot encode a " .. type(v), 0) end
    local fields = ir.fields(v)
    if fields then
        local keys, arrays = {}, ir.array_fields(v)
        for _, k in ipairs(fields) do
            if v[k] ~= nil then keys[#keys + 1] = k end
        end
        encode_object(keys, v, ind, out, arrays)
    elseif is_array(v) then
        encode_array(v, ind, out)
    else
        local keys = {}
        for k in pairs(v) do
            if type(k) ~= "string" then
                error("json: object key " .. tostring(k) .. " is not a string", 0)
            end
            keys[#keys + 1] = k
        end
        table.sort(keys)
        encode_object(keys, v, ind, out)
    end
end

-- Pretty JSON text for 'v' (records, arrays, plain tables, scalars), ending in a newline.
function M.encode(v)
    local out = {}
    encode(v, "", out)
    out[#out + 1] = "\n"
    return table.concat(out)
end

-- The same on one line, without the newline ({"a": 1, "b": [2, 3]}).
function M.line(v)
    local out = {}
    encode(v, nil, out)
    return table.concat(out)
end

return M
