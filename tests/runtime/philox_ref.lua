-- tests/runtime/philox_ref.lua: an independent, deliberately plain re-derivation of the
-- runtime's random numbers (Philox-4x32-10 + Box-Muller, the mapping documented in rt.h),
-- used by tests/runtime/suite.sh to cross-check the C implementation. Not used by the runtime.
--   lua5.4 tests/runtime/philox_ref.lua kat                 -> Random123 known-answer check
--   lua5.4 tests/runtime/philox_ref.lua normal SEED STREAM FIRST COUNT
--       -> one "%.9g" value per line: N(0,1) rounded to f32 for global indices FIRST ..
--          FIRST+COUNT-1 (numbers in decimal or 0x hex; hex wraps to 64 bits)
local M32 = 0xffffffff

local function mulhilo(a, b)            -- 32x32 -> 64 bit product, split (wraps in Lua ints)
    local p = a * b
    return (p >> 32) & M32, p & M32
end

-- ctr: {c0,c1,c2,c3}, key: {k0,k1}; returns 4 words. Key bumped before rounds 2..10.
local function philox(ctr, key)
    local c0, c1, c2, c3 = ctr[1], ctr[2], ctr[3], ctr[4]
    local k0, k1 = key[1], key[2]
    for r = 1, 10 do
        if r > 1 then
            k0 = (k0 + 0x9E3779B9) & M32
            k1 = (k1 + 0xBB67AE85) & M32
        end
        local hi0, lo0 = mulhilo(0xD2511F53, c0)
        local hi1, lo1 = mulhilo(0xCD9E8D57, c2)
        c0, c1, c2, c3 = hi1 ~ c1 ~ k0, lo1, hi0 ~ c3 ~ k1, lo0
    end
    return c0, c1, c2, c3
end

local function normal(seed, stream, idx)
    local x0, x1 = philox({idx & M32, (idx >> 32) & M32, stream & M32, (stream >> 32) & M32},
                          {seed & M32, (seed >> 32) & M32})
    local u1 = (x0 + 1) / 4294967296.0      -- (0, 1]
    local u2 = x1 / 4294967296.0            -- [0, 1)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
end

local function to_f32(x)                    -- round a double to the nearest float
    return (string.unpack("f", string.pack("f", x)))
end

local mode = arg[1]
if mode == "kat" then
    local kat = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{M32, M32, M32, M32}, {M32, M32}, {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    }
    for i, t in ipairs(kat) do
        local o = {philox(t[1], t[2])}
        for j = 1, 4 do
            if o[j] ~= t[3][j] then
                print(string.format("kat %d word %d: got %08x want %08x", i, j, o[j], t[3][j]))
                os.exit(1)
            end
        end
    end
    print("kat ok")
elseif mode == "normal" then
    local seed, stream = math.tointeger(tonumber(arg[2])), math.tointeger(tonumber(arg[3]))
    local first, count = math.tointeger(tonumber(arg[4])), math.tointeger(tonumber(arg[5]))
    for i = first, first + count - 1 do
        print(string.format("%.9g", to_f32(normal(seed, stream, i))))
    end
else
    io.stderr:write("usage: philox_ref.lua kat | normal SEED STREAM FIRST COUNT\n")
    os.exit(2)
end
