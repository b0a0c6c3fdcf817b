#!/bin/sh
# bench/gen_bench.sh: how long build/gen takes, how much memory, and how much it writes, to
# generate gpt3_175b at TP=8 PP=8 for growing data-parallel sizes (DP 16 .. 8192: 1,024 to
# 524,288 ranks). Generation is scale-free: nothing in it grows with DP. Writes into
# build/bench/ and prints one row per configuration, then the size of every file of the
# largest; then how long a layout takes to generate and build once the library is built.
# Not part of make test (docs/DESIGN.md 3).
# Each run is a fresh build/gen process running a small Lua driver (written below into
# build/bench/) that times driver.run with host.clock() and reads the process's peak RSS with
# host.peak_rss_kb(), so GNU time is not needed.
#   bench/gen_bench.sh                 DP 16 128 1024 8192
#   bench/gen_bench.sh 128 1024        only these DP sizes
# Targets (docs/DESIGN.md 4.5): at DP 8192 <= 2 s, <= 200 MiB, generated C <= 2 MiB in all,
# every generated C file <= 64 KiB.
cd "$(dirname "$0")/.." || exit 2
gen=build/gen
[ -x "$gen" ] || { echo "bench: $gen is missing (make build/gen)" >&2; exit 2; }
dir=build/bench
mkdir -p "$dir"
cat > "$dir/measure.lua" <<'LUA'
-- build/bench/measure.lua (written by bench/gen_bench.sh): run the generator once, in this
-- process, and print "seconds peak_rss_kib".
local host = require("host")
local dp, out = tonumber(arg[1]), arg[2]
local t0 = host.clock()
require("driver").run({ model = "gpt3_175b", tp = 8, pp = 8, dp = math.tointeger(dp), out = out })
local t1 = host.clock()
io.stderr:write(string.format("%.3f %d\n", t1 - t0, host.peak_rss_kb()))
LUA
sizes=${*:-16 128 1024 8192}
printf "%-10s %7s %9s %14s %11s %13s %15s\n" "tp8 pp8" "ranks" "wall (s)" "peak RSS (MiB)" \
       "out (KiB)" "C in all (KiB)" "largest C (KiB)"
last=
for dp in $sizes; do
    out=$dir/gpt3_175b-tp8-pp8-dp$dp
    rm -rf "$out"
    res=$("$gen" --lua "$dir/measure.lua" "$dp" "$out" 2>&1 >/dev/null | tail -n 1)
    set -- $res
    if [ $# -ne 2 ]; then echo "bench: dp $dp failed: $res" >&2; exit 1; fi
    all=$(cat "$out"/* | wc -c)
    c=$(cat "$out"/*.c "$out"/*.h | wc -c)
    big=$(wc -c "$out"/*.c "$out"/*.h | grep -v ' total$' | sort -n | tail -n 1 | awk '{print $1}')
    awk -v dp="$dp" -v s="$1" -v kb="$2" -v a="$all" -v c="$c" -v b="$big" 'BEGIN {
        printf "%-10s %7d %9.2f %14.1f %11.1f %13.1f %15.1f\n", "dp" dp, 64 * dp, s, kb / 1024,
               a / 1024, c / 1024, b / 1024 }'
    last=$out
done
echo
echo "files of ${last#"$dir"/}:"
wc -c "$last"/* | grep -v ' total$' | sort -n | awk '{ printf "  %10d  %s\n", $1, $2 }' |
    sed "s|$last/||"

# Building a layout once the library is built: generate tiny at TP 2, PP 2, DP 2 and compile
# and link its programs (train, and train_cuda when the CUDA backend is built), timed with
# make -j2 and serially (-j1). Target (docs/DESIGN.md 4.5): well under 1.5 s with nvcc.
echo
make -s --no-print-directory all > /dev/null 2>&1 || { echo "bench: make all failed" >&2; exit 1; }
targets=train
make -s --no-print-directory echo 2> /dev/null | grep -q 'cuda backend enabled' &&
    targets="train train_cuda"
for j in 2 1; do
    out=$dir/tiny-build-j$j
    rm -rf "$out" "$out.obj"
    t0=$(date +%s.%N)
    "$gen" tiny --tp 2 --pp 2 --dp 2 --out "$out" > /dev/null &&
        make -s --no-print-directory -j$j GEN_DIR="$out" GEN_OBJ="$out.obj" \
            $(for t in $targets; do echo "$out/$t"; done) > /dev/null ||
        { echo "bench: building $out failed" >&2; exit 1; }
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v j="$j" -v t="$targets" 'BEGIN {
        printf "tiny tp2 pp2 dp2, generate + build %s (make -j%d): %.2f s\n", t, j, b - a }'
done
