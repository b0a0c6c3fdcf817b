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
    case=${cmd##*/}
    case=${case%.cmd}
    if [ "$case" = sandbox_bytecode ] && [ $have_luac = 0 ]; then
        skip "$case" "luac5.4 not found (make deps)"
        continue
    fi
    if [ ! -f "tests/errors/$case.err" ]; then
        fail "$case" "tests/errors/$case.err is missing"
        continue
    fi
    # bash's own reads, no process per file: 174 cases, each a few forks less
    IFS= read -r want < "tests/errors/$case.err"
    want_rc=1
    [ -f "tests/errors/$case.rc" ] && read -r want_rc < "tests/errors/$case.rc"
    read -r -a args < "$cmd"      # the arguments are words without spaces
    "$gen" "${args[@]}" --out "$scratch/$case/out" > "$scratch/$case.stdout" \
        2> "$scratch/$case.stderr"
    rc=$?
    mapfile -t errlines < "$scratch/$case.stderr"
    got=${errlines[0]-}
    if [ "$rc" != "$want_rc" ]; then
        fail "$case" "exit status $rc, want $want_rc (stderr: $got)"
    elif [ "$got" != "$want" ]; then
        fail "$case" "first stderr line differs"
        echo "    got:  $got"
        echo "    want: $want"
    elif [ "$rc" != 0 ] && [[ ${errlines[-1]-} != *'no output written'* ]]; then
        fail "$case" "stderr does not end with 'no output written'"
    elif [ "$rc" != 0 ] && [ -e "$scratch/$case/out" ]; then
        fail "$case" "$scratch/$case/out was written despite the error"
    else
        pass "$case"
    fi
done

# -- make variables: pasted into shell commands, so only plain values get that far ---------------
# make_refuses CASE WANT GOAL VAR=VALUE...: make GOAL exits 2, its first stderr line is "*** WANT"
# (after the Makefile's line), and the command a value slips in (touch $scratch/pwned) never runs
make_refuses() {
    local case=$1 want=$2 goal=$3 got rc
    shift 3
    rm -f "$scratch/pwned"
    make -s --no-print-directory "$@" "$goal" > "$scratch/$case.stdout" 2> "$scratch/$case.stderr"
    rc=$?
    got=$(head -n 1 "$scratch/$case.stderr" | sed 's/^Makefile:[0-9]*: \*\*\* //')
    if [ "$rc" != 2 ]; then
        fail "$case" "make exited $rc, want 2 (stderr: $got)"
    elif [ -e "$scratch/pwned" ]; then
        fail "$case" "the command in the value ran: $scratch/pwned exists"
    elif [ "$got" != "$want" ]; then
        fail "$case" "first stderr line differs"
        echo "    got:  $got"
        echo "    want: $want"
    else
        pass "$case"
    fi
}
only="only letters, digits and _ - . / + : = ,"
shell="may be used (the value is pasted into shell commands).  Stop."
v="tiny;touch $scratch/pwned"
make_refuses make_model_injection "MODEL='$v': $only $shell" print-out "MODEL=$v"
v="E|t*4|t*4|L';touch $scratch/pwned;'"
make_refuses make_layout_quote "LAYOUT='$v': $only | * ( ) $shell" print-out MODEL=tiny \
    "LAYOUT=$v"
v="2 --pp 2"
make_refuses make_tp_words "TP='$v': $only $shell" print-out MODEL=tiny "TP=$v"
v="--quiet \`touch $scratch/pwned\`"
make_refuses make_run_args "RUN_ARGS='$v': $only and spaces $shell" run "RUN_ARGS=$v"
make_refuses make_model_missing "MODEL='no_such_model': no models/no_such_model.lua and no \
file no_such_model.  Stop." print-out "MODEL=no_such_model"
# a variable no makefile reads (MSB for MBS) is named, not ignored; GBS is known
make_refuses make_unknown_variable "unknown make variable: MSB (no makefile reads it; \
\`make help\` lists the variables).  Stop." print-out MODEL=tiny MSB=4
if [ "$(make -s --no-print-directory print-out MODEL=tiny DP=2 MBS=2 GBS=8 2>&1)" = \
     out/tiny-tp1-pp1-dp2-mbs2-nmb2 ]; then pass make_gbs
else fail make_gbs "make print-out MODEL=tiny DP=2 MBS=2 GBS=8 is not NMB 2"
fi
finish
