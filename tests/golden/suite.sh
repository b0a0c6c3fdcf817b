#!/bin/bash
# tests/golden/suite.sh: the generator's output for a few configurations, byte for byte.
# A case is tests/golden/<case>/cmd (the gen arguments, one line) and tests/golden/<case>/expect/
# (the expected output directory). <case> is the default output directory name of the command,
# which is checked too. Each case is generated twice, into build/test/golden/<case>/a and /b:
# both must equal expect/ (so the output is deterministic across runs).
#
#   tests/golden/suite.sh            compare (make test SUITE=golden)
#   tests/golden/suite.sh --update   rewrite every expect/ from the current generator
#                                    (make golden-update); review with git diff, then commit
update=0
[ "$1" = "--update" ] && update=1
. "$(dirname "$0")/../lib.sh" golden
gen=build/gen
scratch=$S
if [ ! -x "$gen" ]; then
    fail suite "$gen is missing (make build/gen)"
    finish
fi
for dir in tests/golden/*/; do
    dir=${dir%/}
    case=$(basename "$dir")
    [ -f "$dir/cmd" ] || continue
    args=$(cat "$dir/cmd")
    # shellcheck disable=SC2086 # the arguments are words without spaces
    if ! "$gen" $args --out "$scratch/$case/a" > "$scratch/$case.log" 2>&1 ||
       ! "$gen" $args --out "$scratch/$case/b" >> "$scratch/$case.log" 2>&1; then
        fail "$case" "gen $args failed: $(head -n 1 "$scratch/$case.log")"
        continue
    fi
    if [ $update = 1 ]; then
        rm -rf "$dir/expect"
        cp -r "$scratch/$case/a" "$dir/expect"
        echo "updated tests/golden/$case/expect"
        continue
    fi
    # shellcheck disable=SC2086
    outdir=$("$gen" $args --print-out)
    if [ "$outdir" != "out/$case" ]; then
        fail "$case" "gen $args --print-out says '$outdir', want 'out/$case'"
    elif ! diff -r "$scratch/$case/a" "$scratch/$case/b" > "$scratch/$case.diff"; then
        fail "$case" "two runs differ (see $scratch/$case.diff)"
    elif ! diff -r "$dir/expect" "$scratch/$case/a" > "$scratch/$case.diff"; then
        fail "$case" "$(printf 'output differs from tests/golden/%s/expect (see %s; %s)' \
            "$case" "$scratch/$case.diff" "if intended: make golden-update")"
        head -n 20 "$scratch/$case.diff" | sed 's/^/    /'
    else
        pass "$case"
    fi
done
finish
