#!/bin/sh
# bench/test_bench.sh: how long the test tiers take, from a clean clone of this repository's
# HEAD (so nothing is built yet), on this machine: `make check` (the fast tier), then
# `make test` (everything), with each suite's seconds as tests/run.sh reports them. Prints a
# table and the targets (docs/DESIGN.md 3: make check within 45 s, make test within 6 minutes
# on the 2-core machine). Not part of make test; writes build/bench/test-clone/.
#   bench/test_bench.sh            both tiers
#   bench/test_bench.sh check      only make check
cd "$(dirname "$0")/.." || exit 2
dir=build/bench/test-clone
rm -rf "$dir"
mkdir -p build/bench
git clone -q . "$dir" || { echo "bench: git clone failed" >&2; exit 1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }

t0=$(now)
(cd "$dir" && make check) > build/bench/test-check.log 2>&1
rc_check=$?
t1=$(now)
echo "make check (clean clone, builds build/gen): $(secs "$t0" "$t1") s, exit $rc_check;" \
     "$(tail -n 1 build/bench/test-check.log)   target <= 45 s"
[ "$1" = check ] && exit $rc_check

t0=$(now)
(cd "$dir" && make test) > build/bench/test-all.log 2>&1
rc_test=$?
t1=$(now)
echo "make test (same clone; builds everything else): $(secs "$t0" "$t1") s, exit $rc_test;" \
     "$(tail -n 1 build/bench/test-all.log)   target <= 360 s"
echo "per suite (seconds, as tests/run.sh reports them):"
sed -n 's/^-- \([a-z]*\): .*(\([0-9]*\) s)$/  \1 \2/p' build/bench/test-all.log |
    awk '{ printf "  %-10s %5d\n", $1, $2; t += $2 } END { printf "  %-10s %5d\n", "all", t }'
[ $rc_check = 0 ] && [ $rc_test = 0 ]
