-- util.lua: small pure helpers shared by the passes: deterministic iteration, integer
-- arithmetic, and the text formatting used by reports (numbers, shapes, rank lists, tables).
-- No I/O here.

local M = {}

-- pairs() in sorted key order (keys must be mutually comparable). Use it wherever iteration
-- order can reach output: Lua 5.4 seeds string hashes per run (STYLE 2.5).
function M.sortedpairs(t)
    local keys = {}
    for k in pairs(t) do keys[#keys + 1] = k end
    table.sort(keys)
    local i = 0
    return function()
        i = i + 1
        local k = keys[i]
        if k ~= nil then return k, t[k] end
    end
end

function M.is_int(x)
    return math.type(x) == "integer"
end

-- Assert that 'x' is an integer (an internal check at module boundaries).
function M.check_int(x, what)
    if math.type(x) ~= "integer" then
        error(string.format("%s must be an integer, got %s (%s)", what, tostring(x),
                            math.type(x) or type(x)), 2)
    end
    return x
end

function M.gcd(a, b)
    while b ~= 0 do a, b = b, a % b end
    return a
end

function M.lcm(a, b)
    return a // M.gcd(a, b) * b
end

-- Smallest multiple of m that is >= x.
function M.round_up(x, m)
    return (x + m - 1) // m * m
end

function M.product(list)
    local p = 1
    for _, v in ipairs(list) do p = p * v end
    return p
end

-- 174604259328 -> "174,604,259,328"
function M.thousands(n)
    local s = string.format("%d", n)
    local sign, digits = s:match("^(-?)(%d+)$")
    local out = digits:reverse():gsub("(%d%d%d)", "%1,"):reverse()
    if out:sub(1, 1) == "," then out = out:sub(2) end
    return sign .. out
end

-- Bytes in binary units, 2 decimals: 1536 -> "1.50 KiB".
function M.bytes(n)
    local units = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" }
    local u, x = 1, n
    while x >= 1024 and u < #units do x = x / 1024; u = u + 1 end
    if u == 1 then return string.format("%d B", n) end
    return string.format("%.2f %s", x, units[u])
end

-- {12288, 36864} -> "[12288, 36864]"
function M.shape(dims)
    local parts = {}
    for i, d in ipairs(dims) do parts[i] = string.format("%d", d) end
    return "[" .. table.concat(parts, ", ") .. "]"
end

-- Compact text for the ascending ranks list[i..j] (whole list by default): "5", "0-7",
-- "3-59 step 8", runs "0-3,8-11", equal runs at equal strides "0-7,64-71,...,1984-1991";
-- other long lists are cut to about 'width' characters with ",...".
function M.ranks(list, i, j, width)
    i, j, width = i or 1, j or #list, width or 48
    local n = j - i + 1
    if n <= 0 then return "-" end
    if n == 1 then return string.format("%d", list[i]) end
    local step = list[i + 1] - list[i]
    local uniform = true
    for k = i + 2, j do
        if list[k] - list[k - 1] ~= step then uniform = false; break end
    end
    if uniform and step == 1 then
        return string.format("%d-%d", list[i], list[j])
    elseif uniform and n > 2 then
        return string.format("%d-%d step %d", list[i], list[j], step)
    end
    local runs, k = {}, i
    while k <= j do
        local e = k
        while e < j and list[e + 1] == list[e] + 1 do e = e + 1 end
        runs[#runs + 1] = { list[k], list[e] }
        k = e + 1
    end
    local text = {}
    for r, run in ipairs(runs) do
        text[r] = (run[1] == run[2]) and string.format("%d", run[1])
                  or string.format("%d-%d", run[1], run[2])
    end
    local regular = #runs >= 4
    for r = 2, #runs do
        if runs[r][2] - runs[r][1] ~= runs[1][2] - runs[1][1]
           or runs[r][1] - runs[r - 1][1] ~= runs[2][1] - runs[1][1] then
            regular = false
        end
    end
    if regular then
        return text[1] .. "," .. text[2] .. ",...," .. text[#text]
    end
    local out, used = {}, 0
    for r, t in ipairs(text) do
        if r < #text and used + #t + 5 > width then
            out[#out + 1] = "..."
            break
        end
        out[#out + 1] = t
        used = used + #t + 1
    end
    return table.concat(out, ",")
end

-- Lay out rows of cells as aligned text. 'align' is a string with one letter per column,
-- "l" or "r". Trailing spaces are trimmed. Returns the lines as an array.
function M.columns(rows, align, gap)
    gap = gap or 2
    local width = {}
    for _, row in ipairs(rows) do
        for c, cell in ipairs(row) do
            if #cell > (width[c] or 0) then width[c] = #cell end
        end
    end
    local lines, sep = {}, string.rep(" ", gap)
    for r, row in ipairs(rows) do
        local cells = {}
        for c, cell in ipairs(row) do
            local pad = string.rep(" ", width[c] - #cell)
            cells[c] = (align:sub(c, c) == "r") and (pad .. cell) or (cell .. pad)
        end
        lines[r] = (table.concat(cells, sep):gsub("%s+$", ""))
    end
    return lines
end

-- Shallow copy of an array part.
-- Words in lines of at most 'width' characters (a longer word alone on its line).
function M.wrap(words, width)
    local lines, cur = {}, nil
    for _, w in ipairs(words) do
        if cur and #cur + 1 + #w <= width then cur = cur .. " " .. w
        else
            if cur then lines[#lines + 1] = cur end
            cur = w
        end
    end
    lines[#lines + 1] = cur
    return lines
end

function M.copy(list)
    local out = {}
    for i = 1, #list do out[i] = list[i] end
    return out
end

return M
