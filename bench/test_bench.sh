#!/bin/bash
# bench/test_bench.sh: how long the test tiers take, from a clean clone of this repository (so
# nothing is built yet), on this machine: `make check` (the fast tier), then `make test`
# (everything), with each suite's wall and CPU seconds as tests/run.sh reports them, the total
# CPU (user + system of everything make ran) and the machine's load before and after (the
# 2-core machine is shared: CPU seconds tell work from waiting). Prints a table and the targets
# (docs/DESIGN.md §3, tests/README.md: make check within 30 s, make test within 6 minutes on
# the 2-core machine). Not part of make test; writes build/bench/test-clone/.
#   bench/test_bench.sh [all|check|test] [REV]
#     all (default): both tiers; check: only make check; test: only make test (after make all)
#     REV: measure that commit instead of HEAD (e.g. the one before a change, for a before and
#     after on the same machine); its tests/run.sh may print wall seconds only.
cd "$(dirname "$0")/.." || exit 2
what=${1:-all}
rev=${2:-HEAD}
dir=build/bench/test-clone
rm -rf "$dir"
mkdir -p build/bench
git clone -q . "$dir" && git -C "$dir" checkout -q "$rev" ||
    { echo "bench: cannot clone this repository at $rev" >&2; exit 1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "commit $(git -C "$dir" log --oneline -1 | cut -c1-70); $(nproc) CPUs; load $(load)"

# tier NAME TARGET: make TARGET in the clone; its wall and CPU seconds, exit status, last line
tier() {
    local t0 t1 rc cpu
    t0=$(now)
    (
        cd "$dir" && make "$2" > "../test-$1.log" 2>&1
        rc=$?
        times > ../test-$1.cpu      # this shell's, then its children's: user, system
        exit $rc
    )
    rc=$?
    t1=$(now)
    cpu=$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { m = $i; sub(/m.*/, "", m)
                                                   x = $i; sub(/^[0-9]*m/, "", x); sub(/s$/, "", x)
                                                   t += m * 60 + x }
                         printf "%.0f", t }' "build/bench/test-$1.cpu" 2> /dev/null)
    echo "make $2: $(secs "$t0" "$t1") s (CPU ${cpu:-?} s), exit $rc;" \
         "$(tail -n 1 "build/bench/test-$1.log")   load after: $(load)"
    return $rc
}

rc_check=0
if [ "$what" != test ]; then
    tier check check
    rc_check=$?
    echo "  target: make check (clean clone, builds build/gen) <= 30 s"
fi
[ "$what" = check ] && exit $rc_check

if [ "$what" = test ]; then
    (cd "$dir" && make -s all) > build/bench/test-all-build.log 2>&1
    echo "make all first: done ($(load))"
fi
tier all test
rc_test=$?
echo "  target: make test <= 360 s"
echo "per suite (seconds, as tests/run.sh reports them; suites overlap, so the walls add up to"
echo "more than the whole):"
echo "  suite        wall    CPU"
sed -n 's/^-- \([a-z]*\): .*(\([0-9]*\) s\(, CPU \([0-9]*\) s\)*)$/\1 \2 \4/p' \
        build/bench/test-all.log |
    awk '{ printf "  %-10s %6d %6s\n", $1, $2, $3 == "" ? "-" : $3; w += $2; c += $3 }
         END { printf "  %-10s %6d %6d\n", "sum", w, c }'
[ $rc_check = 0 ] && [ $rc_test = 0 ]
