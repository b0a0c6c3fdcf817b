-- tests/train/fixtures.lua: makes test inputs for tests/train/suite.sh (lua5.4, no modules):
-- safetensors files cast to BF16 / F16 (round to nearest even), broken variants of a good
-- file (one defect each), and token files decoded back to bytes. Reads only the simple
-- headers our writers produce ({"name":{"dtype":..,"shape":[..],"data_offsets":[a,b]},...}).
--
--   lua5.4 fixtures.lua cast BF16|F16 IN OUT
--   lua5.4 fixtures.lua drop IN OUT NAME          remove a tensor
--   lua5.4 fixtures.lua extra IN OUT NAME         add a tensor NAME [4] F32 (zeros)
--   lua5.4 fixtures.lua reshape IN OUT NAME D0,D1 change a tensor's shape (same byte count)
--   lua5.4 fixtures.lua dtype IN OUT NAME DTYPE   change a tensor's dtype (same byte count)
--   lua5.4 fixtures.lua corrupt IN OUT            break the JSON (a key without its value)
--   lua5.4 fixtures.lua hlen IN OUT               a header length larger than the file
--   lua5.4 fixtures.lua nudge IN OUT NAME I       F32 element I of NAME one ulp up
--   lua5.4 fixtures.lua poke IN OUT NAME I X      F32 element I of NAME set to X (nan, inf, ...)
--   lua5.4 fixtures.lua unaligned IN OUT          header padded to 8k + 1 bytes
--   lua5.4 fixtures.lua gap IN OUT                4 unused bytes after the first tensor
--   lua5.4 fixtures.lua decode IN OUT             uint16 tokens (bare or llm.c shard) to bytes
--   lua5.4 fixtures.lua logkeys FILE N            N lines, steps 1..N, keys exactly step, loss,
--                                                 lr, grad_norm, ms, comm_ms, tok_s, tflops, mem_mib,
--                                                 mem_peak_mib, rss_mib
--                                                 with number values

local function die(fmt, ...)
    io.stderr:write("fixtures.lua: error: " .. string.format(fmt, ...) .. "\n")
    os.exit(1)
end

local function slurp(path)
    local f = io.open(path, "rb") or die("cannot open %s", path)
    local s = f:read("a")
    f:close()
    return s
end

local function spit(path, s)
    local f = io.open(path, "wb") or die("cannot create %s", path)
    f:write(s)
    f:close()
end

-- { {name=, dtype=, shape={...}, bytes=}, ... } in header order (metadata dropped)
local function st_read(path)
    local raw = slurp(path)
    local hlen = string.unpack("<I8", raw)
    local header = raw:sub(9, 8 + hlen)
    local data0 = 8 + hlen
    local out = {}
    for name, dtype, shape, b, e in header:gmatch(
            '"([^"]+)":{"dtype":"(%w+)","shape":%[([%d,]*)%],"data_offsets":%[(%d+),(%d+)%]}') do
        local dims = {}
        for d in shape:gmatch("%d+") do dims[#dims + 1] = math.tointeger(tonumber(d)) end
        out[#out + 1] = { name = name, dtype = dtype, shape = dims,
                          bytes = raw:sub(data0 + tonumber(b) + 1, data0 + tonumber(e)) }
    end
    if #out == 0 then die("%s: no tensors found", path) end
    return out
end

-- header_hook(header) may rewrite the JSON; pad is the header length modulo 8 (default 0).
local function st_write(path, tensors, header_hook, pad)
    local parts, off = {}, 0
    for _, t in ipairs(tensors) do
        parts[#parts + 1] = string.format('"%s":{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}',
            t.name, t.dtype, table.concat(t.shape, ","), off, off + #t.bytes)
        off = off + #t.bytes
    end
    local header = '{"__metadata__":{"format":"pt"},' .. table.concat(parts, ",") .. "}"
    if header_hook then header = header_hook(header) end
    header = header .. string.rep(" ", ((pad or 0) - #header) % 8)
    local data = {}
    for i, t in ipairs(tensors) do data[i] = t.bytes end
    spit(path, string.pack("<I8", #header) .. header .. table.concat(data))
end

local function find(tensors, name)
    for i, t in ipairs(tensors) do
        if t.name == name then return i, t end
    end
    die("no tensor '%s'", name)
end

-- F32 bits -> BF16 bits, round to nearest even (NaN stays a quiet NaN).
local function bf16(u)
    if u & 0x7fffffff > 0x7f800000 then return (u >> 16) | 0x40 end
    return (u + 0x7fff + ((u >> 16) & 1)) >> 16
end

-- F32 bits -> F16 bits, round to nearest even, with subnormals, overflow to infinity.
local function f16(u)
    local sign, e, m = (u >> 16) & 0x8000, (u >> 23) & 0xff, u & 0x7fffff
    if e == 255 then return sign | 0x7c00 | (m ~= 0 and 0x200 or 0) end
    local E = e - 127 + 15
    if E >= 31 then return sign | 0x7c00 end
    local shift, base
    if E <= 0 then                                  -- subnormal (or zero) result
        if E < -10 then return sign end
        m, shift, base = m | 0x800000, 14 - E, 0
    else
        shift, base = 13, E << 10
    end
    local h, rem, halfway = base | (m >> shift), m & ((1 << shift) - 1), 1 << (shift - 1)
    if rem > halfway or (rem == halfway and h & 1 == 1) then h = h + 1 end
    return sign | h                                  -- a carry rounds up into the exponent
end

local cmd = arg[1]
if cmd == "cast" then
    local to, conv = arg[2], ({ BF16 = bf16, F16 = f16 })[arg[2]]
    if not conv then die("cast to BF16 or F16, not %s", tostring(to)) end
    local ts = st_read(arg[3])
    for _, t in ipairs(ts) do
        if t.dtype ~= "F32" then die("tensor %s is %s, not F32", t.name, t.dtype) end
        local out = {}
        for k = 1, #t.bytes, 4 do
            out[#out + 1] = string.pack("<I2", conv(string.unpack("<I4", t.bytes, k)))
        end
        t.bytes, t.dtype = table.concat(out), to
    end
    st_write(arg[4], ts)
elseif cmd == "drop" then
    local ts = st_read(arg[2])
    table.remove(ts, (find(ts, arg[4])))
    st_write(arg[3], ts)
elseif cmd == "extra" then
    local ts = st_read(arg[2])
    ts[#ts + 1] = { name = arg[4], dtype = "F32", shape = { 4 }, bytes = string.rep("\0", 16) }
    st_write(arg[3], ts)
elseif cmd == "reshape" then
    local ts = st_read(arg[2])
    local _, t = find(ts, arg[4])
    t.shape = {}
    for d in arg[5]:gmatch("%d+") do t.shape[#t.shape + 1] = math.tointeger(tonumber(d)) end
    st_write(arg[3], ts)
elseif cmd == "dtype" then
    local ts = st_read(arg[2])
    local _, t = find(ts, arg[4])
    t.dtype = arg[5]
    st_write(arg[3], ts)
elseif cmd == "corrupt" then
    st_write(arg[3], st_read(arg[2]), function(h)
        return (h:gsub('"data_offsets":%[0,', '"data_offsets":', 1))
    end)
elseif cmd == "hlen" then
    local raw = slurp(arg[2])
    spit(arg[3], string.pack("<I8", #raw) .. raw:sub(9))
elseif cmd == "nudge" then
    local ts = st_read(arg[2])
    local _, t = find(ts, arg[4])
    local at = 4 * math.tointeger(tonumber(arg[5])) + 1
    local u = string.unpack("<I4", t.bytes, at)
    t.bytes = t.bytes:sub(1, at - 1) .. string.pack("<I4", u + 1) .. t.bytes:sub(at + 4)
    st_write(arg[3], ts)
elseif cmd == "poke" then
    local ts = st_read(arg[2])
    local _, t = find(ts, arg[4])
    local at = 4 * math.tointeger(tonumber(arg[5])) + 1
    local x = arg[6] == "nan" and 0 / 0 or arg[6] == "inf" and math.huge or
              arg[6] == "-inf" and -math.huge or tonumber(arg[6]) or die("bad value %s", arg[6])
    t.bytes = t.bytes:sub(1, at - 1) .. string.pack("<f", x) .. t.bytes:sub(at + 4)
    st_write(arg[3], ts)
elseif cmd == "unaligned" then
    st_write(arg[3], st_read(arg[2]), nil, 1)
elseif cmd == "gap" then
    local ts = st_read(arg[2])
    ts[1].bytes = ts[1].bytes .. string.rep("\0", 4)          -- written, then hidden
    st_write(arg[3], ts, function(h)
        local e = #ts[1].bytes
        return (h:gsub('"data_offsets":%[0,' .. e .. '%]',
                       '"data_offsets":[0,' .. (e - 4) .. ']', 1))
    end)
elseif cmd == "decode" then
    local raw = slurp(arg[2])
    local first = 1
    if #raw >= 1024 and string.unpack("<i4", raw) == 20240520 then first = 1025 end
    local out = {}
    for k = first, #raw - 1, 2 do
        local v = string.unpack("<I2", raw, k)
        if v > 255 then die("%s: token %d at byte %d is not a byte", arg[2], v, k - 1) end
        out[#out + 1] = string.char(v)
    end
    spit(arg[3], table.concat(out))
elseif cmd == "logkeys" then
    local want, n = "step,loss,lr,grad_norm,ms,comm_ms,tok_s,tflops,mem_mib,mem_peak_mib,rss_mib", 0
    for line in io.lines(arg[2]) do
        n = n + 1
        local keys, vals = {}, {}
        for k, v in line:gmatch('"([%w_]+)":([^,}]+)') do
            keys[#keys + 1] = k
            vals[#vals + 1] = v
        end
        if not line:match("^{.*}$") or table.concat(keys, ",") ~= want then
            die("%s:%d: keys %s, expected %s", arg[2], n, table.concat(keys, ","), want)
        end
        for i, v in ipairs(vals) do
            if not tonumber(v) then die("%s:%d: '%s' is not a number", arg[2], n, keys[i]) end
        end
        if tonumber(vals[1]) ~= n then die("%s:%d: step %s, expected %d", arg[2], n, vals[1], n) end
    end
    if n ~= tonumber(arg[3]) then die("%s: %d lines, expected %s", arg[2], n, arg[3]) end
else
    die("unknown command '%s' (see the header of tests/train/fixtures.lua)", tostring(cmd))
end
