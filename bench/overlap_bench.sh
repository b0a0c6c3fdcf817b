#!/bin/bash
# bench/overlap_bench.sh: what the overlapped data-parallel communication buys on this machine
# (never part of make test). For each layout the same program is generated three ways --
# OVERLAP=0 (each reduction started where it is waited: Megatron without --overlap-grad-reduce),
# the default (overlap, Megatron's default bucket size: on small models one bucket per buffer),
# and overlap with BUCKET (default 4M elements: a bucket every few layers) -- and the runs
# alternate (off on small off on small ...) so that a drift of the machine hits all alike.
# Prints per program the median over rounds of
#   ms       the step's wall time (median of the steps after WARMUP in the --log);
#   comm_ms  the log's comm_ms: rank 0's time blocked in communication during the step, the
#            part of the step's communication no computation hid (rt_comm_stats);
# and each overlapped form against OVERLAP=0 (ratio < 1: faster / less exposed).
#
#   bench/overlap_bench.sh [dp2] [dp2-distopt] [tp2-dp2]     (default: dp2 dp2-distopt)
#   ROUNDS=N (3)  STEPS=N (8)  WARMUP=N (2)  BUCKET=N (4000000)  RT_THREADS=t (1)
#
# Model: models/gpt2_124m.lua, 64-token sequences, MBS 4 per data-parallel rank (a global
# batch of 8 sequences at DP 2), on tokens from build/ref/make_tokens. One thread per rank:
# DP 2 uses both cores of the dev VM, TP 2 x DP 2 oversubscribes them 2x. On the CPU the MPI
# transport reduces in the ranks' main threads (rt_progress between layers), so overlap hides
# waiting (one rank's skew, message latency), not the reduction's arithmetic; on GPUs NCCL
# reduces on its own stream. Scratch: build/bench/overlap/.
cd "$(dirname "$0")/.." || exit 2
B=build/bench/overlap
mkdir -p $B
what=${*:-dp2 dp2-distopt}
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-8} WARMUP=${WARMUP:-2} BUCKET=${BUCKET:-4000000}
export RT_THREADS=${RT_THREADS:-1}
MPIRUN="mpirun --oversubscribe --bind-to none -x RT_THREADS"
[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"

make -s --no-print-directory build/gen build/libgpt_cpu.a build/librt_cpu.a ref > $B/make.log 2>&1 ||
    { echo "make failed: $(tail -n 3 $B/make.log)"; exit 1; }
[ -f $B/tok.bin ] || build/ref/make_tokens --vocab 50257 --tokens 200000 $B/tok.bin > /dev/null

# prog NAME GEN-ARGS...: generate and build NAME; prints the program's path
prog() {
    local name=$1 dir
    shift
    dir=$(realpath $B)/$name
    build/gen "$@" --out "$dir" > "$dir.gen.log" 2>&1 &&
    make -s --no-print-directory GEN_DIR="$dir" GEN_OBJ="$dir.obj" "$dir/train" \
        > "$dir.build.log" 2>&1 || { echo "cannot build $name: see $dir.*.log" >&2; return 1; }
    echo "$dir/train"
}

# median KEY LOG: the median of KEY over the steps after WARMUP
median() {
    sed -n "s/.*\"step\":\([0-9]*\),.*\"$1\":\([0-9.]*\).*/\1 \2/p" "$2" |
        awk -v w="$WARMUP" '$1 > w { print $2 }' | sort -n |
        awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'
}
mid() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

printf '%-12s %-22s %10s %10s %8s %8s\n' layout form ms comm_ms "ms/off" "comm/off"
for w in $what; do
    case $w in
        dp2) args=(--dp 2); np=2 ;;
        dp2-distopt) args=(--dp 2 --dist-opt); np=2 ;;
        tp2-dp2) args=(--tp 2 --dp 2 --sp); np=4 ;;
        *) echo "unknown layout $w (dp2, dp2-distopt, tp2-dp2)"; exit 2 ;;
    esac
    base=(gpt2_124m --seq 64 --mbs 4 "${args[@]}")
    declare -A path=()
    path[off]=$(prog "$w-off" "${base[@]}" --no-overlap) || exit 1
    path[on]=$(prog "$w-on" "${base[@]}") || exit 1
    path[small]=$(prog "$w-small" "${base[@]}" --bucket-size "$BUCKET") || exit 1
    declare -A ms=() comm=()
    for ((r = 1; r <= ROUNDS; r++)); do
        for form in off on small; do
            $MPIRUN -np $np "${path[$form]}" --data $B/tok.bin --steps "$STEPS" --quiet \
                --log $B/run.jsonl > $B/run.log 2>&1 ||
                { echo "run failed: ${path[$form]}"; tail -n 5 $B/run.log; exit 1; }
            ms[$form]="${ms[$form]} $(median ms $B/run.jsonl)"
            comm[$form]="${comm[$form]} $(median comm_ms $B/run.jsonl)"
        done
    done
    # shellcheck disable=SC2086
    off_ms=$(mid ${ms[off]}) off_comm=$(mid ${comm[off]})
    for form in off on small; do
        label="OVERLAP=0"
        [ $form = on ] && label="overlap"
        [ $form = small ] && label="overlap BUCKET=$BUCKET"
        # shellcheck disable=SC2086
        m=$(mid ${ms[$form]}) c=$(mid ${comm[$form]})
        awk -v w="$w" -v l="$label" -v m="$m" -v c="$c" -v om="$off_ms" -v oc="$off_comm" \
            'BEGIN { printf "%-12s %-22s %10.1f %10.1f %8.3f %8.3f\n", w, l, m, c, m / om,
                     (oc > 0 ? c / oc : 0) }'
    done
    unset path ms comm
done
