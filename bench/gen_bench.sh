#!/bin/sh
# bench/gen_bench.sh: how long build/gen takes, and how much memory, to generate gpt3_175b at
# TP=8 PP=8 for growing data-parallel sizes (1024, 8192 and 65536 ranks). Writes into
# build/bench/ and prints one row per configuration. Not part of make test (DESIGN.md 3).
# Each run is a fresh build/gen process running a small Lua driver (written below into
# build/bench/) that times driver.run with host.clock() and reads the process's peak RSS with
# host.peak_rss_kb(), so GNU time is not needed.
#   bench/gen_bench.sh            all three sizes
#   bench/gen_bench.sh 128 1024   only these DP sizes
cd "$(dirname "$0")/.." || exit 2
gen=build/gen
[ -x "$gen" ] || { echo "bench: $gen is missing (make build/gen)" >&2; exit 2; }
dir=build/bench
mkdir -p "$dir"
cat > "$dir/measure.lua" <<'LUA'
-- build/bench/measure.lua (written by bench/gen_bench.sh): run the generator once, in this
-- process, and print "seconds peak_rss_kib output_bytes".
local host = require("host")
local dp, out = tonumber(arg[1]), arg[2]
local t0 = host.clock()
require("driver").run({ model = "gpt3_175b", tp = 8, pp = 8, dp = math.tointeger(dp), out = out })
local t1 = host.clock()
local bytes = 0
for _, name in ipairs({ "topology.json", "shards.json", "report.txt", "MANIFEST" }) do
    local f = assert(io.open(out .. "/" .. name, "rb"))
    bytes = bytes + f:seek("end")
    f:close()
end
io.stderr:write(string.format("%.3f %d %d\n", t1 - t0, host.peak_rss_kb(), bytes))
LUA
sizes=${*:-16 128 1024}
printf "%-28s %7s %9s %14s %11s\n" "gpt3_175b tp8 pp8" "ranks" "wall (s)" "peak RSS (MiB)" \
       "out (MiB)"
for dp in $sizes; do
    out=$dir/gpt3_175b-tp8-pp8-dp$dp
    rm -rf "$out"
    res=$("$gen" --lua "$dir/measure.lua" "$dp" "$out" 2>&1 >/dev/null | tail -n 1)
    set -- $res
    if [ $# -ne 3 ]; then echo "bench: dp $dp failed: $res" >&2; exit 1; fi
    awk -v dp="$dp" -v s="$1" -v kb="$2" -v b="$3" 'BEGIN {
        printf "%-28s %7d %9.2f %14.1f %11.1f\n", "dp" dp, 64 * dp, s, kb / 1024, b / 1048576 }'
done
