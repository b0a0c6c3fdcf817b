#!/bin/bash
# bench/fuzz.sh: fuzz every reader of outside input with libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer (clang; make deps installs it): the template lexer and compiler,
# the model-description loader (Lua sandbox included), the generator's and the training
# program's command lines, the safetensors reader, the token files (nanoGPT, llm.c) and
# Megatron's indexed datasets. The harnesses are tests/fuzz/fuzz_*.c (make fuzzers).
# Each runs a stated number of executions, two at a time (the model loader alone on one
# core: a Lua state per input makes it the slowest), starting from its seed corpus
# tests/fuzz/corpus/<h>/ and the crash reproducers tests/fuzz/crashes/<h>/. Not part of
# make test, which replays those files (tests/fuzz/suite.sh). Prints a table:
#   harness, executions, seconds, crashes, corpus (files, KB: the seeds and what was found).
# The defaults take about 10 minutes on 2 cores (608 s on the 2-core VM they were set on).
#
#   bench/fuzz.sh [HARNESS...]       all harnesses, or the ones named
#   RUNS=N bench/fuzz.sh             N executions each      SCALE=0.1: a tenth of the defaults
#
# Work files in build/fuzz-work/<h>/: corpus/ (the grown corpus), log, and crash-*, leak-*,
# timeout-*, oom-* (what libFuzzer found; each also minimised into min-*). A crash found is a
# bug: fix it, then copy the minimised input to tests/fuzz/crashes/<h>/ as its regression test.
cd "$(dirname "$0")/.." || exit 2
W=build/fuzz-work

# Executions per harness: 40 to 120 s each there; the model loader, about 100 a second, 600 s.
declare -A DEFAULT=([tmpl_lex]=8000000 [tmpl_parse]=2500000 [model]=60000 [gen_cli]=8000000
                    [safetensors]=1500000 [tokens]=2500000 [megatron]=1000000 [flags]=6000000)
# Longest input, in bytes
declare -A MAXLEN=([model]=8192 [tmpl_lex]=8192 [tmpl_parse]=8192)

# one HARNESS RUNS: fuzz it; its result line goes to $W/HARNESS/result
one() {
    local h=$1 runs=$2 d=$W/$1
    rm -rf "$d"
    mkdir -p "$d/corpus"
    local seeds=(tests/fuzz/corpus/"$h")
    [ -d "tests/fuzz/crashes/$h" ] && seeds+=(tests/fuzz/crashes/"$h")
    local dict=()
    [ -f "tests/fuzz/$h.dict" ] && dict=(-dict="tests/fuzz/$h.dict")
    local start=$SECONDS
    # -close_fd_mask=3: the harnesses' own messages (usage errors, ...) are not wanted here;
    # libFuzzer and the sanitizers still report.
    TMPDIR=$d ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 "build/fuzzer-$h" \
        -runs="$runs" -max_len="${MAXLEN[$h]:-4096}" -timeout=20 -rss_limit_mb=2048 \
        -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="$d/" "${dict[@]}" \
        "$d/corpus" "${seeds[@]}" > "$d/log" 2>&1
    local rc=$? secs=$((SECONDS - start)) execs crashes=0 a
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$d/log" | tail -n 1)
    for a in "$d"/crash-* "$d"/leak-* "$d"/timeout-* "$d"/oom-*; do
        [ -f "$a" ] || continue
        crashes=$((crashes + 1))
        "build/fuzzer-$h" -minimize_crash=1 -runs=20000 -close_fd_mask=3 \
            -exact_artifact_path="$d/min-$(basename "$a")" "$a" > "$d/minimize.log" 2>&1
    done
    [ $rc != 0 ] && [ $crashes = 0 ] && crashes="? (exit $rc)"
    local files kb
    files=$(find "$d/corpus" "${seeds[@]}" -type f | wc -l)
    kb=$(du -skc --apparent-size "$d/corpus" "${seeds[@]}" | tail -n 1 | cut -f1)
    printf '%-12s %12s %8s %8s %8s %8s\n' "$h" "${execs:-?}" "$secs" "$crashes" "$files" \
        "$kb" > "$d/result"
}

if [ "$1" = --one ]; then
    one "$2" "$3"
    exit 0
fi

command -v clang > /dev/null || { echo "fuzz.sh: clang not found (make deps)"; exit 1; }
if ! make -s --no-print-directory -j2 fuzzers > /dev/null; then
    echo "fuzz.sh: make fuzzers failed (clang with libFuzzer: make deps installs it)"
    exit 1
fi
harnesses=("$@")
[ ${#harnesses[@]} = 0 ] && harnesses=(model tmpl_lex tmpl_parse gen_cli safetensors tokens
                                       megatron flags)
jobs=()
for h in "${harnesses[@]}"; do
    if [ -z "${DEFAULT[$h]}" ]; then
        echo "fuzz.sh: no harness '$h' (one of: ${!DEFAULT[*]})"
        exit 2
    fi
    n=${RUNS:-$(awk -v n="${DEFAULT[$h]}" -v s="${SCALE:-1}" 'BEGIN { printf "%d", n * s }')}
    jobs+=("$h $n")
done
mkdir -p "$W"
start=$SECONDS
# two workers; the first job (the model loader, by default) keeps one to itself
printf '%s\n' "${jobs[@]}" | xargs -P 2 -L 1 "$0" --one
printf '%-12s %12s %8s %8s %8s %8s\n' harness executions seconds crashes files KB
for h in "${harnesses[@]}"; do cat "$W/$h/result"; done
echo "total: $((SECONDS - start)) s on $(nproc) cores; clang $(clang -dumpversion)," \
     "-fsanitize=fuzzer,address,undefined"
bad=$(ls "$W"/*/min-* 2> /dev/null)
if [ -n "$bad" ]; then
    echo "crashes (minimised; fix, then copy to tests/fuzz/crashes/<harness>/):"
    echo "$bad" | sed 's/^/  /'
    exit 1
fi
