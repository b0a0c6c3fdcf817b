#!/bin/bash
# tests/lua/suite.sh: the pure-pass tests, tests/lua/*_test.lua, each run by build/gen --lua.
# Every test file prints "PASS lua/<file>/<test>" or "FAIL ...: why" per test (harness.lua);
# a file that dies without printing its verdicts counts as one failure here.
# Run from anywhere: tests/lua/suite.sh   (or: make test SUITE=lua)
. "$(dirname "$0")/../lib.sh" lua
gen=build/gen
if [ ! -x "$gen" ]; then
    fail suite "$gen is missing (make build/gen)"
    finish
fi
# the files run two at a time (schedule_test, the sweep, about half the suite's CPU, first);
# their verdicts are printed in file order
run_file() {
    "$gen" --lua "$1" > "$S/$2.out" 2> "$S/$2.err"
    echo $? > "$S/$2.rc"
}
files=(tests/lua/schedule_test.lua)
for t in tests/lua/*_test.lua; do
    [ "$t" = tests/lua/schedule_test.lua ] || files+=("$t")
done
for t in "${files[@]}"; do
    [ "$(jobs -pr | wc -l)" -ge 2 ] && wait -n
    run_file "$t" "$(basename "$t" _test.lua)" &
done
wait
for t in tests/lua/*_test.lua; do
    name=$(basename "$t" _test.lua)
    out=$S/$name.out
    rc=$(cat "$S/$name.rc")
    cat "$out"
    if grep -q '^FAIL ' "$out"; then
        FAILED=1
        sed 's/^/    /' "$S/$name.err" | head -n 20
    fi
    if [ "$rc" -ne 0 ]; then
        fail "$name" "$t exited with status $rc"
        sed 's/^/    /' "$S/$name.err" | head -n 20
    fi
done
finish
