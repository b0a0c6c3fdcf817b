-- tests/pipeline/stcompare.lua: compare two safetensors files tensor by tensor (F32 only).
-- Run: build/gen --lua tests/pipeline/stcompare.lua GOT.safetensors WANT.safetensors ATOL RTOL
-- Every tensor of WANT must be in GOT with the same shape; an element passes when
-- |got - want| <= ATOL + RTOL*|want| (llm.c style). Prints one line "max |diff| D at NAME[i]";
-- on failure also the first 5 mismatches, and exits 1. Used by tests/pipeline/suite.sh until
-- the project has a shared tool for it.

local got_path, want_path = arg[1], arg[2]
local atol, rtol = tonumber(arg[3] or "0"), tonumber(arg[4] or "0")
if not (got_path and want_path and atol and rtol) then
    io.stderr:write("usage: gen --lua stcompare.lua GOT WANT ATOL RTOL\n")
    os.exit(2)
end

-- name -> {dtype, shape text, first byte, last byte}, plus the data of the file.
local function load(path)
    local f = io.open(path, "rb")
    if not f then io.stderr:write("stcompare: cannot open " .. path .. "\n"); os.exit(2) end
    local data = f:read("a")
    f:close()
    local n = string.unpack("<I8", data)
    local header = data:sub(9, 8 + n)
    local t, names = {}, {}
    for name, dtype, shape, a, b in header:gmatch(
            '"([^"]+)":%s*{%s*"dtype":%s*"(%w+)",%s*"shape":%s*%[([^%]]*)%],%s*' ..
            '"data_offsets":%s*%[(%d+),%s*(%d+)%]%s*}') do
        t[name] = { dtype = dtype, shape = shape:gsub("%s", ""), a = 8 + n + tonumber(a),
                    b = 8 + n + tonumber(b) }
        names[#names + 1] = name
    end
    return { data = data, t = t, names = names }
end

local got, want = load(got_path), load(want_path)
local maxd, where, bad, shown = 0.0, "-", 0, 0
local BATCH = 256
for _, name in ipairs(want.names) do
    local w, g = want.t[name], got.t[name]
    if not g then
        print(("missing tensor %s in %s"):format(name, got_path)); os.exit(1)
    end
    if w.dtype ~= "F32" or g.dtype ~= "F32" or w.shape ~= g.shape then
        print(("%s: %s[%s] vs %s[%s]"):format(name, g.dtype, g.shape, w.dtype, w.shape))
        os.exit(1)
    end
    local count = (w.b - w.a) // 4
    local i = 0
    while i < count do
        local k = math.min(BATCH, count - i)
        local fmt = "<" .. string.rep("f", k)
        local gv = { string.unpack(fmt, got.data, g.a + 1 + 4 * i) }
        local wv = { string.unpack(fmt, want.data, w.a + 1 + 4 * i) }
        for j = 1, k do
            local x, y = gv[j], wv[j]
            local d = math.abs(x - y)
            if d ~= d or d > maxd then maxd, where = d, ("%s[%d]"):format(name, i + j - 1) end
            if not (d <= atol + rtol * math.abs(y)) then
                bad = bad + 1
                if shown < 5 then
                    shown = shown + 1
                    print(("  %s[%d]: got %.9g want %.9g"):format(name, i + j - 1, x, y))
                end
            end
        end
        i = i + k
    end
end
print(("max |diff| %.3g at %s; %d element(s) outside atol %g + rtol %g"):format(
    maxd, where, bad, atol, rtol))
os.exit(bad == 0 and 0 or 1)
