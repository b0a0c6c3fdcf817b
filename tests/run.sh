#!/bin/bash
# tests/run.sh: run every test suite (tests/*/suite.sh) and tally the results.
# Each suite prints "PASS name", "FAIL name: why" or "SKIP name: why" per test (tests/lib.sh has
# the verdicts and the helpers every suite shares; docs/DESIGN.md §3 the layout of the tests).
# Usage: tests/run.sh [suite ...]   Ends with "N passed, N failed, N skipped"; exit 1 on failure.
cd "$(dirname "$0")/.." || exit 2
if [ $# -gt 0 ]; then
    suites=""
    for s in "$@"; do suites="$suites tests/$s/suite.sh"; done
else
    suites=$(ls tests/*/suite.sh 2>/dev/null | sort)
fi
mkdir -p build/test
# MPI's settings for every suite (TEST_MCA, the environment), found once
. tests/mpi.sh
log=build/test/results.txt
: > "$log"
for s in $suites; do
    name=$(basename "$(dirname "$s")")
    if [ ! -x "$s" ]; then
        echo "FAIL $name/suite.sh: missing or not executable" | tee -a "$log"
        continue
    fi
    start=$(date +%s)
    out=build/test/$name.out
    "$s" > "$out" 2>&1
    rc=$?
    # pass the suite's output through, keep the verdict lines for the tally
    cat "$out"
    grep -E '^(PASS|FAIL|SKIP) ' "$out" >> "$log"
    if [ $rc -ne 0 ] && ! grep -q '^FAIL ' "$out"; then
        echo "FAIL $name/suite.sh crashed (exit $rc)" | tee -a "$log"
    fi
    echo "-- $name: $(grep -c '^PASS ' "$out") passed, $(grep -c '^FAIL ' "$out") failed," \
         "$(grep -c '^SKIP ' "$out") skipped ($(( $(date +%s) - start )) s)"
done
passed=$(grep -c '^PASS ' "$log")
failed=$(grep -c '^FAIL ' "$log")
skipped=$(grep -c '^SKIP ' "$log")
if [ "$failed" -gt 0 ]; then
    echo
    echo "failures:"
    grep '^FAIL ' "$log" | sed 's/^/  /'
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
