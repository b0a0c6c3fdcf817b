#!/bin/sh
# bench/attention_bench.sh: CPU causal attention, forward + backward, at GPT-2 shapes (B 4,
# 12 heads of 64 channels, T 64, 256, 1024), on 1 and 2 cores (taskset, RT_THREADS): the
# library's tiled kernels in f32 and bf16 against the (T, T) kernels of commit 80ea565 (f32),
# which this script takes from git history and compiles with the library's flags. Prints ms and
# GFLOP/s of the FLOPs causal attention needs (bench/attention_bench.c). Never part of make test.
#   bench/attention_bench.sh [REPS]      best of REPS runs per line (default 5)
cd "$(dirname "$0")/.." || exit 2
REPS=${1:-5}
B=build/bench/attention
OLD=80ea565
mkdir -p $B/old
make -s --no-print-directory build/librt_cpu.a build/lib/kernels_cpu.o || exit 1
OPT=$(make -s --no-print-directory echo | sed -n 's/^.* LIB_OPT=\(.*\) GEN_OPT=.*$/\1/p')
LIBS=$(make -s --no-print-directory -f Makefile -f /dev/stdin print-libs <<'EOF'
print-libs:
	@echo $(RT_CPU_LIBS)
EOF
)
for f in kernels_cpu.c kernel_rows.h kernels.h; do
    git show $OLD:lib/$f > $B/old/$f || exit 1
done
# shellcheck disable=SC2086 # OPT and LIBS are lists of flags
mpicc -std=c11 $OPT -Iruntime -Ilib -o $B/tiled bench/attention_bench.c \
    build/lib/kernels_cpu.o $LIBS || exit 1
# shellcheck disable=SC2086
mpicc -std=c11 $OPT -Iruntime -I$B/old -DATT_TT -o $B/txt bench/attention_bench.c \
    $B/old/kernels_cpu.c $LIBS || exit 1
lscpu | sed -n 's/^Model name: *//p; s/^CPU family: */CPU family /p' | tr '\n' ' '
echo
printf '%-6s %-5s %2s %3s %3s %5s %3s %9s %9s %8s %8s %8s\n' impl dtype B Hl hd T thr \
    fwd_ms bwd_ms fwd_GF bwd_GF total_GF
for T in 64 256 1024; do
    for thr in 1 2; do
        cpus=0; [ $thr = 2 ] && cpus=0,1
        for run in "txt f32" "tiled f32" "tiled bf16"; do
            set -- $run
            RT_THREADS=$thr taskset -c $cpus $B/$1 4 12 64 $T "$REPS" "$2" |
                awk '{ printf "%-6s %-5s %2s %3s %3s %5s %3s %9s %9s %8s %8s %8s\n",
                       $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 }'
        done
    done
done
