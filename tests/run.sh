#!/bin/bash
# tests/run.sh: run the test suites (tests/*/suite.sh) side by side and tally the results.
# Each suite prints "PASS name", "FAIL name: why" or "SKIP name: why" per test (tests/lib.sh has
# the verdicts and the helpers every suite shares; docs/DESIGN.md §3 the layout of the tests;
# tests/README.md the suites, their tiers and their times).
# Usage: tests/run.sh [suite ...]   Ends with "N passed, N failed, N skipped"; exit 1 on failure.
#
# First `make test-deps` builds what the suites share (the generator, libraries, runtime tests,
# reference, tools, the CUDA emulation), once, so that no two suites build the same file at the
# same time (TEST_PREBUILT=1: the caller did it). Then TEST_JOBS suites run at a time (default
# 3: on 2 cores a suite often waits -- mpirun start-up, sleeps, one-process steps -- and a third
# fills those gaps; more only adds switching), the longest first. A suite's output goes to
# $R/<suite>.out (R = $TEST_SCRATCH or build/test; its scratch is $R/<suite>/), and is printed
# whole when it ends, in sorted order. Two runs with different TEST_SCRATCH share no file.
cd "$(dirname "$0")/.." || exit 2
R=${TEST_SCRATCH:-build/test}
JOBS=${TEST_JOBS:-3}

# The suites, the most CPU first (tests/README.md), so that the last to run are short: moe is
# the longest chain; runtime and faults hold tests bounded in wall time (better not among the
# last, when everything else is short of CPU too). A suite not in this list starts after them.
LONGEST="moe parallel precision kernels llama runtime launch single pipeline cp faults train
         program reshard eval walkthrough data tokenizer generate hfload lr lua errors refcheck fuzz
         regions tmpl golden plot layering"

if [ $# -gt 0 ]; then
    suites="$*"
else
    suites=$(ls tests/*/suite.sh 2> /dev/null | sed 's|^tests/\(.*\)/suite.sh$|\1|' | sort)
fi
mkdir -p "$R"

# MPI's settings for every suite (TEST_MCA, the environment), found once
. tests/mpi.sh

# -- What the suites share, built once ---------------------------------------------------
if [ -z "$TEST_PREBUILT" ]; then
    if make -s --no-print-directory -j2 test-deps TEST_SUITES="$suites" > "$R/test-deps.log" 2>&1
    then
        TEST_PREBUILT=1
    else
        # each suite then builds what it needs itself (and says what failed): one at a time
        echo "tests/run.sh: make test-deps failed (see $R/test-deps.log); running the suites" \
             "one at a time"
        tail -n 5 "$R/test-deps.log" | sed 's/^/  /'
        JOBS=1
    fi
fi
export TEST_PREBUILT

# The tokens: TEST_TOKENS programs (an equivalence row's run or build, a kernel mutant) at once
# over all the suites (tests/lib.sh, equiv), through a FIFO on fd 8 holding one byte a token.
TEST_TOKENS=${TEST_TOKENS:-2}
rm -f "$R/.tokens"
if mkfifo "$R/.tokens" 2> /dev/null && exec 8<> "$R/.tokens"; then
    rm -f "$R/.tokens"
    printf "%${TEST_TOKENS}s" "" | tr ' ' x >&8
    export TEST_TOKENS
else
    TEST_TOKENS=""
fi

# -- The pool -----------------------------------------------------------------------------------

# run_suite NAME: the suite's output in $R/NAME.out, its status and times in $R/NAME.status:
# "rc wall-seconds cpu-seconds" (CPU: user + system of everything it ran)
run_suite() {
    local name=$1 t0 rc
    t0=$(date +%s.%N)
    (
        "tests/$name/suite.sh" > "$R/$name.out" 2>&1 < /dev/null
        rc=$?
        # times: this subshell's, then its children's (user, system), e.g. "0m1.5s 0m0.3s"
        echo "$rc" > "$R/$name.status.tmp"
        times >> "$R/$name.status.tmp"
    )
    { read -r rc; read -r _; read -r cu cs; } < "$R/$name.status.tmp"
    rm -f "$R/$name.status.tmp"
    echo "$rc $(awk -v a="$t0" -v b="$(date +%s.%N)" -v u="$cu" -v s="$cs" '
        function secs(x,  m) { m = x; sub(/m.*/, "", m); sub(/^[0-9]*m/, "", x); sub(/s$/, "", x)
                              return m * 60 + x }
        BEGIN { printf "%.0f %.0f", b - a, secs(u) + secs(s) }')" > "$R/$name.status"
}

# report NAME: print the suite's output and its line of counts
report() {
    local name=$1 out=$R/$1.out rc wall cpu
    if [ ! -x "tests/$name/suite.sh" ]; then
        echo "FAIL $name/suite.sh: missing or not executable"
        return
    fi
    read -r rc wall cpu < "$R/$name.status"
    cat "$out"
    if [ "$rc" -ne 0 ] && ! grep -q '^FAIL ' "$out"; then
        echo "FAIL $name/suite.sh crashed (exit $rc)" | tee -a "$out"
    fi
    echo "-- $name: $(grep -c '^PASS ' "$out") passed, $(grep -c '^FAIL ' "$out") failed," \
         "$(grep -c '^SKIP ' "$out") skipped ($wall s, CPU $cpu s)"
}

# start order: the longest first, then the rest as given
order=""
for s in $LONGEST; do
    case " $(echo $suites) " in *" $s "*) order="$order $s" ;; esac
done
for s in $suites; do
    case " $order " in *" $s "*) ;; *) order="$order $s" ;; esac
done

read -r -a all <<< "$(echo $suites)"
declare -A PID DONE
running=0
printed=0
# print_ready: the finished suites at the head of the sorted list, in that order
print_ready() {
    while [ $printed -lt ${#all[@]} ] && [ -n "${DONE[${all[$printed]}]}" ]; do
        report "${all[$printed]}"
        printed=$((printed + 1))
    done
}
# reap: wait until a suite ends; mark the ended ones done (and on a terminal, say so: the
# output waits for the suites before it in the sorted order)
reap() {
    local s
    wait -n
    for s in "${!PID[@]}"; do
        if ! kill -0 "${PID[$s]}" 2> /dev/null; then
            DONE[$s]=1
            unset "PID[$s]"
            running=$((running - 1))
            [ -t 2 ] && echo "tests/run.sh: $s ended ($(cut -d' ' -f2 "$R/$s.status") s);" \
                "running: ${!PID[*]}" >&2
        fi
    done
    print_ready
}
for s in $order; do
    rm -f "$R/$s.out" "$R/$s.status"
    if [ ! -x "tests/$s/suite.sh" ]; then
        DONE[$s]=1
        continue
    fi
    while [ $running -ge "$JOBS" ]; do reap; done
    run_suite "$s" &
    PID[$s]=$!
    running=$((running + 1))
done
while [ $running -gt 0 ]; do reap; done
print_ready

# -- The tally: this run's verdicts (also in $R/results.txt) -------------------------------
log=$R/results.txt
: > "$log"
for s in "${all[@]}"; do
    if [ -x "tests/$s/suite.sh" ]; then
        grep -E '^(PASS|FAIL|SKIP) ' "$R/$s.out" >> "$log"
    else
        echo "FAIL $s/suite.sh: missing or not executable" >> "$log"
    fi
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
