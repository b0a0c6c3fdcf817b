#!/bin/bash
# tests/errors/suite.sh: bad input must be refused with the exact first error line, the right
# exit status, and nothing written.
# A case is tests/errors/<case>.cmd (the gen arguments on one line; model cases name their
# tests/errors/<case>.lua) with <case>.err (the expected first line of stderr, exact) and,
# optionally, <case>.rc (the expected exit status; default 1, a user error). Each run gets
# --out build/test/errors/<case>/out, which must not exist afterwards unless the status is 0.
# sandbox_bytecode.src.lua is compiled here with luac5.4 (shipped with lua5.4) into the
# precompiled chunk that case must refuse.
. "$(dirname "$0")/../lib.sh" errors
gen=build/gen
scratch=$S
if [ ! -x "$gen" ]; then
    fail suite "$gen is missing (make build/gen)"
    finish
fi
have_luac=1
luac5.4 -o "$scratch/sandbox_bytecode.lua" tests/errors/sandbox_bytecode.src.lua 2>/dev/null \
    || have_luac=0
for cmd in tests/errors/*.cmd; do
    case=$(basename "$cmd" .cmd)
    if [ "$case" = sandbox_bytecode ] && [ $have_luac = 0 ]; then
        skip "$case" "luac5.4 not found (make deps)"
        continue
    fi
    if [ ! -f "tests/errors/$case.err" ]; then
        fail "$case" "tests/errors/$case.err is missing"
        continue
    fi
    want=$(cat "tests/errors/$case.err")
    want_rc=1
    [ -f "tests/errors/$case.rc" ] && want_rc=$(cat "tests/errors/$case.rc")
    # shellcheck disable=SC2046 # the arguments are words without spaces
    "$gen" $(cat "$cmd") --out "$scratch/$case/out" > "$scratch/$case.stdout" \
        2> "$scratch/$case.stderr"
    rc=$?
    got=$(head -n 1 "$scratch/$case.stderr")
    if [ "$rc" != "$want_rc" ]; then
        fail "$case" "exit status $rc, want $want_rc (stderr: $got)"
    elif [ "$got" != "$want" ]; then
        fail "$case" "first stderr line differs"
        echo "    got:  $got"
        echo "    want: $want"
    elif [ "$rc" != 0 ] && ! tail -n 1 "$scratch/$case.stderr" | grep -q 'no output written'; then
        fail "$case" "stderr does not end with 'no output written'"
    elif [ "$rc" != 0 ] && [ -e "$scratch/$case/out" ]; then
        fail "$case" "$scratch/$case/out was written despite the error"
    else
        pass "$case"
    fi
done
finish
