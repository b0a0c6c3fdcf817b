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
for t in tests/lua/*_test.lua; do
    name=$(basename "$t" _test.lua)
    out=$S/$name.out
    "$gen" --lua "$t" > "$out" 2> "$S/$name.err"
    rc=$?
    cat "$out"
    if grep -q '^FAIL ' "$out"; then
        FAILED=1
        sed 's/^/    /' "$S/$name.err" | head -n 20
    fi
    if [ $rc -ne 0 ]; then
        fail "$name" "$t exited with status $rc"
        sed 's/^/    /' "$S/$name.err" | head -n 20
    fi
done
finish
