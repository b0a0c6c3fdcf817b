#!/bin/bash
# tests/fuzz/suite.sh: the fuzzing harnesses as regression tests. Builds every harness
# (tests/fuzz/fuzz_*.c) with gcc, ASan and UBSan and replay.c (make fuzz-replay:
# build/fuzz-<h>), then replays its seed corpus tests/fuzz/corpus/<h>/ and every crash
# reproducer tests/fuzz/crashes/<h>/ (inputs that once crashed a reader, fixed since). Any
# sanitizer report, abort (fz_bug) or time-out fails the harness. No clang needed: the
# fuzzing itself is bench/fuzz.sh. In the sanitizer build (make test SANITIZE=1) it also runs
# the training layouts of tests/fuzz/layouts.txt. Prints PASS/FAIL/SKIP fuzz/<name>.
. "$(dirname "$0")/../lib.sh" fuzz
F=tests/fuzz
if ! make -s --no-print-directory -j2 fuzz-replay > "$S/make.log" 2>&1; then
    sed 's/^/  /' "$S/make.log" | tail -n 20
    fail build "make fuzz-replay failed"
    finish
fi
# The harnesses check leaks too (FUZZ_ASAN_OPTIONS=detect_leaks=0 where LeakSanitizer cannot
# run: it needs ptrace); the sanitizer build's ASAN_OPTIONS, for MPI programs, do not apply.
HARNESS_ASAN=${FUZZ_ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
for h in $(make -s --no-print-directory -f Makefile -f /dev/stdin print-fuzz <<'MK'
print-fuzz:
	@echo $(FUZZ_HARNESSES)
MK
); do
    dirs=()
    for d in "$F/corpus/$h" "$F/crashes/$h"; do
        [ -d "$d" ] && dirs+=("$d")
    done
    if [ ${#dirs[@]} = 0 ]; then
        skip "$h" "no corpus in $F/corpus/$h"
        continue
    fi
    log=$S/$h.log
    if TMPDIR=$S ASAN_OPTIONS=$HARNESS_ASAN timeout 120 "build/fuzz-$h" "${dirs[@]}" \
            > "$log" 2>&1; then
        pass "$h"
    else
        grep -E -m3 'ERROR|runtime error|fuzz: bug|SUMMARY' "$log" | sed 's/^/  /'
        fail "$h" "replaying ${dirs[*]}: $(TMPDIR=$S ASAN_OPTIONS=$HARNESS_ASAN \
            REPLAY_VERBOSE=1 timeout 120 "build/fuzz-$h" "${dirs[@]}" 2>&1 |
            grep '^replay: ' | tail -n 1 | cut -c9-)"
    fi
done
# In the sanitizer build (make test SANITIZE=1: tests/fuzz/sanitize.sh) a few training layouts
# too, tests/fuzz/layouts.txt: generated programs, library and runtime under ASan + UBSan.
if [ -f .sanitize-tree ]; then
    if ! make -s --no-print-directory -j2 build/gen build/librt_cpu.a build/libgpt_cpu.a ref \
            build/tools/stcompare > "$S/make-layouts.log" 2>&1; then
        fail layouts "make gen, libraries, ref, stcompare: $(tail -n 1 "$S/make-layouts.log")"
    elif ! build/ref/gpt2_ref --layers 8 --hidden 64 --heads 4 --seq 64 --vocab 256 \
            --random-init 7 --save-init "$S/tiny.init.safetensors" > "$S/ref.log" 2>&1 ||
         ! build/ref/make_tokens --vocab 256 --tokens 20000 --seed 3 "$S/tiny.bin" \
            >> "$S/ref.log" 2>&1; then
        fail layouts "cannot make the init or token file: $(tail -n 1 "$S/ref.log")"
    else
        equiv tests/fuzz/layouts.txt
    fi
fi
if ls "$S"/fuzz-* > /dev/null 2>&1; then
    fail tempfiles "a harness left files behind: $(ls -d "$S"/fuzz-* | head -n 3 | tr '\n' ' ')"
fi
finish
