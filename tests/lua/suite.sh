#!/bin/sh
# tests/lua/suite.sh: the pure-pass tests, tests/lua/*_test.lua, each run by build/gen --lua.
# Every test file prints "PASS lua/<file>/<test>" or "FAIL ...: why" per test (harness.lua);
# a file that dies without printing its verdicts counts as one failure here.
# Run from anywhere: tests/lua/suite.sh   (or: make test SUITE=lua)
cd "$(dirname "$0")/../.." || exit 2
gen=build/gen
if [ ! -x "$gen" ]; then
    echo "FAIL lua/suite: $gen is missing (make build/gen)"
    exit 1
fi
mkdir -p build/test/lua
status=0
for t in tests/lua/*_test.lua; do
    name=$(basename "$t" _test.lua)
    out=build/test/lua/$name.out
    "$gen" --lua "$t" > "$out" 2> build/test/lua/$name.err
    rc=$?
    cat "$out"
    if grep -q '^FAIL ' "$out"; then
        status=1
        sed 's/^/    /' build/test/lua/$name.err | head -n 20
    fi
    if [ $rc -ne 0 ]; then
        echo "FAIL lua/$name: $t exited with status $rc"
        sed 's/^/    /' build/test/lua/$name.err | head -n 20
        status=1
    fi
done
exit $status
