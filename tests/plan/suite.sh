#!/bin/bash
# tests/plan/suite.sh: make plan / gen --plan (gen/lua/plan.lua) on small cases: properties of
# its choices (tests/plan/plan_test.lua: every listed layout valid, fitting and planned as the
# full program plans it; a rejected layout's reason the generator's own error; the best the
# fastest; more memory never removes a layout; known costs rank the expected way), its
# refusals, its report, and the memory warning of gen and make inspect. No timing here
# (bench/plan_bench.sh measures).
. "$(dirname "$0")/../lib.sh" plan

if ! make -s --no-print-directory build/gen > "$S/make.log" 2>&1; then
    fail build "make build/gen: $(first_error "$S/make.log")"
    finish
fi

# -- Properties ---------------------------------------------------------------------------------
build/gen --lua tests/plan/plan_test.lua > "$S/props.out" 2> "$S/props.err"
rc=$?
if [ $rc != 0 ]; then fail props "status $rc: $(head -c 300 "$S/props.err")"; fi
while read -r word rest; do
    case $word in
    ok) pass "${rest}" ;;
    not) fail "${rest#ok }" "" ;;
    esac
done < "$S/props.out"

# -- Refusals: status 1, the message ------------------------------------------------------------
refuse() {
    local name=$1 want=$2
    shift 2
    build/gen --plan tiny "$@" > "$S/$name.out" 2> "$S/$name.err"
    local rc=$?
    if [ $rc != 1 ]; then fail "err-$name" "status $rc, want 1"
    elif ! grep -qF -- "$want" "$S/$name.err"; then
        fail "err-$name" "got '$(head -n 1 "$S/$name.err")'"
    elif [ -s "$S/$name.out" ]; then fail "err-$name" "a report was printed"
    else pass "err-$name"; fi
}
refuse nodes "GPUS=12 is not a whole number of nodes of GPUS_PER_NODE=8: choose a multiple of 8" \
    --gpus 12
refuse gpu "GPU=v100: unknown device (one of: h100, h200, a100, cpu)" --gpus 2 --gpu v100
refuse mem "the smallest plan found needs" --gpus 2 --gpu-mem 0.0001
refuse gpus "--plan needs GPUS=N" --gpus 0
refuse sizes "no layout of GPUS=4 ranks has the sizes given" --gpus 4 --tp 3

# -- The report: a ranked table, the best's make command, WHY=1's reasons -----------------------
if make -s --no-print-directory plan MODEL=tiny GPUS=2 GPU=h100 WHY=1 > "$S/plan.out" 2>&1 &&
   grep -q '^best: make MODEL=tiny TP=' "$S/plan.out" &&
   grep -q '^ 1  tp' "$S/plan.out" && grep -q '^rejected (' "$S/plan.out"; then
    pass report
else
    fail report "$(head -n 3 "$S/plan.out")"
fi
# the best's command generates: its sizes are valid as printed
cmd=$(sed -n 's/^best: make //p' "$S/plan.out")
if [ -n "$cmd" ] && make -s --no-print-directory print-out $cmd > "$S/best.err" 2>&1; then
    pass best-generates
else
    fail best-generates "$cmd: $(head -n 1 "$S/best.err")"
fi

# -- The warning of gen and make inspect when a plan exceeds GPU_MEM -----------------------------
build/gen --inspect tiny --tp 2 --gpu-mem 0.001 > /dev/null 2> "$S/warn.err"
if grep -q "warning: the plan does not fit .*stage 0 (ranks 0-1) needs .* GiB > 0.0 GiB: " \
       "$S/warn.err"; then pass warn-inspect; else fail warn-inspect "$(cat "$S/warn.err")"; fi
build/gen --check tiny --gpu h100 > /dev/null 2> "$S/nowarn.err"
if [ ! -s "$S/nowarn.err" ]; then pass no-warn-when-fits; else
    fail no-warn-when-fits "$(cat "$S/nowarn.err")"; fi
finish
