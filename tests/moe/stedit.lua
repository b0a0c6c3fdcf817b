-- tests/moe/stedit.lua: small safetensors surgery for tests/moe/suite.sh (lua5.4, no modules).
-- Makes the routing edge cases out of a random --init (router rows zeroed for ties, a channel
-- of ln_2.bias raised so that chosen router rows dominate or lose every token), and reads
-- tensors back to check what a run did to them. Reads only the simple headers our writers
-- produce ({"name":{"dtype":"F32","shape":[..],"data_offsets":[a,b]},...}); F32 tensors only.
--
--   lua5.4 stedit.lua edit IN OUT OP...     apply the OPs in order, write OUT:
--       fill PATTERN VALUE                  every element of every tensor whose whole name
--                                           matches the Lua PATTERN
--       set NAME INDEX VALUE                one element (flat index from 0)
--   lua5.4 stedit.lua ratio A B PATTERN     over the tensors matching PATTERN, the elements
--                                           with B != 0: prints "n min max" of A/B
--   lua5.4 stedit.lua same A B PATTERN      exit 0 when the matching tensors hold exactly the
--                                           same bits in A and B, else 1 (prints the first)
-- Exit status 0 ok, 1 failure (message on stderr).

local function die(fmt, ...)
    io.stderr:write("stedit.lua: error: " .. string.format(fmt, ...) .. "\n")
    os.exit(1)
end

-- { header_len, json, data, tensors = { {name, dtype, shape, a, b}... in file order } }
local function load(path)
    local f = io.open(path, "rb") or die("cannot open %s", path)
    local s = f:read("a")
    f:close()
    if #s < 8 then die("%s: too short", path) end
    local n = string.unpack("<I8", s)
    if 8 + n > #s then die("%s: header length %d past the end", path, n) end
    local json = s:sub(9, 8 + n)
    local st = { json = json, data = s:sub(9 + n), tensors = {}, by = {} }
    for name, dtype, shape, a, b in json:gmatch(
            '"([^"]+)":{"dtype":"(%w+)","shape":%[([%d,]*)%],"data_offsets":%[(%d+),(%d+)%]}') do
        local t = { name = name, dtype = dtype, shape = shape, a = tonumber(a), b = tonumber(b) }
        st.tensors[#st.tensors + 1] = t
        st.by[name] = t
    end
    if #st.tensors == 0 then die("%s: no tensors in the header", path) end
    return st
end

local function values(st, t)
    if t.dtype ~= "F32" then die("%s is %s, not F32", t.name, t.dtype) end
    local out = {}
    for i = 0, (t.b - t.a) // 4 - 1 do
        out[i] = string.unpack("<f", st.data, t.a + 4 * i + 1)
    end
    return out
end

local function matching(st, pattern)
    local list = {}
    for _, t in ipairs(st.tensors) do
        if t.name:match("^" .. pattern .. "$") then list[#list + 1] = t end
    end
    if #list == 0 then die("no tensor matches '%s'", pattern) end
    return list
end

-- Replace the F32 element 'i' of tensor t in the data string (pieces collected, then joined).
local function edit(inp, out, ops)
    local st = load(inp)
    local patch = {}                                  -- byte offset -> packed value
    local i = 1
    while i <= #ops do
        local op = ops[i]
        if op == "fill" then
            local v = tonumber(ops[i + 2]) or die("fill: bad value '%s'", tostring(ops[i + 2]))
            for _, t in ipairs(matching(st, ops[i + 1])) do
                if t.dtype ~= "F32" then die("%s is %s, not F32", t.name, t.dtype) end
                for k = 0, (t.b - t.a) // 4 - 1 do patch[t.a + 4 * k] = string.pack("<f", v) end
            end
            i = i + 3
        elseif op == "set" then
            local t = st.by[ops[i + 1] or ""] or die("no tensor '%s'", tostring(ops[i + 1]))
            local k = math.tointeger(tonumber(ops[i + 2]))
            local v = tonumber(ops[i + 3])
            if not k or k < 0 or k >= (t.b - t.a) // 4 then die("set: bad index for %s", t.name) end
            if not v then die("set: bad value '%s'", tostring(ops[i + 3])) end
            patch[t.a + 4 * k] = string.pack("<f", v)
            i = i + 4
        else
            die("unknown edit '%s' (fill PATTERN VALUE | set NAME INDEX VALUE)", tostring(op))
        end
    end
    local offs = {}
    for o in pairs(patch) do offs[#offs + 1] = o end
    table.sort(offs)
    local parts, at = {}, 0
    for _, o in ipairs(offs) do
        parts[#parts + 1] = st.data:sub(at + 1, o)
        parts[#parts + 1] = patch[o]
        at = o + 4
    end
    parts[#parts + 1] = st.data:sub(at + 1)
    local f = io.open(out .. ".tmp", "wb") or die("cannot write %s", out)
    f:write(string.pack("<I8", #st.json), st.json, table.concat(parts))
    f:close()
    assert(os.rename(out .. ".tmp", out))
end

local function ratio(pa, pb, pattern)
    local A, B = load(pa), load(pb)
    local n, lo, hi = 0, math.huge, -math.huge
    for _, tb in ipairs(matching(B, pattern)) do
        local ta = A.by[tb.name] or die("%s has no '%s'", pa, tb.name)
        local va, vb = values(A, ta), values(B, tb)
        for k = 0, #vb do
            if vb[k] ~= 0 then
                local q = va[k] / vb[k]
                n, lo, hi = n + 1, math.min(lo, q), math.max(hi, q)
            end
        end
    end
    if n == 0 then die("no nonzero elements in the tensors matching '%s'", pattern) end
    print(string.format("%d %.17g %.17g", n, lo, hi))
end

local function same(pa, pb, pattern)
    local A, B = load(pa), load(pb)
    for _, tb in ipairs(matching(B, pattern)) do
        local ta = A.by[tb.name] or die("%s has no '%s'", pa, tb.name)
        if A.data:sub(ta.a + 1, ta.b) ~= B.data:sub(tb.a + 1, tb.b) then
            print(tb.name .. " differs")
            os.exit(1)
        end
    end
end

local cmd = arg[1]
if cmd == "edit" and arg[3] then
    edit(arg[2], arg[3], { table.unpack(arg, 4) })
elseif cmd == "ratio" and arg[4] then
    ratio(arg[2], arg[3], arg[4])
elseif cmd == "same" and arg[4] then
    same(arg[2], arg[3], arg[4])
else
    die("usage: stedit.lua edit IN OUT OP... | ratio A B PATTERN | same A B PATTERN")
end
