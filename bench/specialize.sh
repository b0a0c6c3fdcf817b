#!/bin/sh
# bench/specialize.sh: would compile-time shapes make the CPU kernels faster? Builds
# bench/specialize.c twice per shape set with the library's flags (LIB_OPT), once with the shapes
# as run-time values (what the library does: one build for every layout) and once as constants
# (what a per-layout kernel build would do), runs both on one core and prints ns per row and
# the ratio (above 1: constants are faster). Never part of make test.
#   bench/specialize.sh            shapes of tiny (C 64, T 64, V 256) and GPT-2 124M (768, 1024,
#                                  50304)
cd "$(dirname "$0")/.." || exit 2
B=build/bench/specialize
mkdir -p $B
OPT=$(make -s --no-print-directory echo | sed -n 's/^.* LIB_OPT=\(.*\) GEN_OPT=.*$/\1/p')
CC=${CC:-gcc}
printf '%-8s %-15s %12s %12s %7s\n' shapes kernel "run-time ns" "constant ns" ratio
for shapes in "64 64 256 20000" "768 1024 50304 200"; do
    set -- $shapes
    c=$1 t=$2 v=$3 reps=$4
    # shellcheck disable=SC2086 # OPT is a list of flags
    $CC -std=c11 $OPT -Ilib -o $B/generic bench/specialize.c -lm || exit 1
    # shellcheck disable=SC2086
    $CC -std=c11 $OPT -Ilib -DSPEC_C="$c" -DSPEC_T="$t" -DSPEC_V="$v" -o $B/const_$c \
        bench/specialize.c -lm || exit 1
    taskset -c 0 $B/generic "$c" "$t" "$v" "$reps" > $B/generic_$c.txt
    taskset -c 0 $B/const_$c "$c" "$t" "$v" "$reps" > $B/const_$c.txt
    paste $B/generic_$c.txt $B/const_$c.txt | while read -r k g _ s; do
        printf '%-8s %-15s %12s %12s %7.2f\n' "C=$c" "$k" "$g" "$s" \
            "$(awk -v a="$g" -v b="$s" 'BEGIN { print a / b }')"
    done
done
