#!/bin/sh
# tests/golden/suite.sh: the generator's output for a few configurations, byte for byte.
# A case is tests/golden/<case>/cmd (the gen arguments, one line) and tests/golden/<case>/expect/
# (the expected output directory). <case> is the default output directory name of the command,
# which is checked too. Each case is generated twice, into build/test/golden/<case>/a and /b:
# both must equal expect/ (so the output is deterministic across runs).
#
#   tests/golden/suite.sh            compare (make test SUITE=golden)
#   tests/golden/suite.sh --update   rewrite every expect/ from the current generator
#                                    (make golden-update); review with git diff, then commit
cd "$(dirname "$0")/../.." || exit 2
gen=build/gen
scratch=build/test/golden
update=0
[ "$1" = "--update" ] && update=1
if [ ! -x "$gen" ]; then
    echo "FAIL golden/suite: $gen is missing (make build/gen)"
    exit 1
fi
rm -rf "$scratch"
mkdir -p "$scratch"
status=0
for dir in tests/golden/*/; do
    dir=${dir%/}
    case=$(basename "$dir")
    [ -f "$dir/cmd" ] || continue
    args=$(cat "$dir/cmd")
    # shellcheck disable=SC2086 # the arguments are words without spaces
    if ! "$gen" $args --out "$scratch/$case/a" > "$scratch/$case.log" 2>&1 ||
       ! "$gen" $args --out "$scratch/$case/b" >> "$scratch/$case.log" 2>&1; then
        echo "FAIL golden/$case: gen $args failed: $(head -n 1 "$scratch/$case.log")"
        status=1
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
        echo "FAIL golden/$case: gen $args --print-out says '$outdir', want 'out/$case'"
        status=1
    elif ! diff -r "$scratch/$case/a" "$scratch/$case/b" > "$scratch/$case.diff"; then
        echo "FAIL golden/$case: two runs differ (see $scratch/$case.diff)"
        status=1
    elif ! diff -r "$dir/expect" "$scratch/$case/a" > "$scratch/$case.diff"; then
        echo "FAIL golden/$case: output differs from tests/golden/$case/expect" \
             "(see $scratch/$case.diff; if intended: make golden-update)"
        head -n 20 "$scratch/$case.diff" | sed 's/^/    /'
        status=1
    else
        echo "PASS golden/$case"
    fi
done
exit $status
