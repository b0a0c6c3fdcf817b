#!/bin/bash
# bench/moe_bench.sh: expert parallelism on the CPU backend (not part of make test).
#   all-to-all bytes  every MPI_Alltoallv the generated program issues, counted per
#                     communicator and datatype by an MPI profiling shim (bench/moe_a2a_count.c,
#                     LD_PRELOAD; the CPU runtime's rt_alltoallv is one MPI_Alltoallv), summed
#                     over the ranks and divided by the steps, against the analytic count of the
#                     report (inspect.moe_traffic through bench/moe_traffic.lua, a balanced
#                     load). Two figures per group kind (ep, expt-tp): bytes sent including each
#                     rank's block to itself -- every kept choice travels exactly once, so
#                     without a capacity this must equal the analytic count exactly, whatever
#                     the balance -- and bytes sent to other ranks, which depend on how evenly
#                     the router spreads the tokens (the analytic figure assumes an even spread).
#   tokens/s          for a fixed global batch (16 sequences of 128, micro-batches of 2) at
#                     EP 1, 2, 4 on 4 ranks (DP 4; and TP 2 x DP 2 with SP): the median of the
#                     program's logged tok_s over the steps after the first two, the best of
#                     BENCH_REPEAT (2) runs taken in turn (BENCH_STEPS: 12 steps a run).
# Each rank runs one thread (RT_THREADS=1; BENCH_THREADS=n to change); 4 ranks on a 2-core VM
# oversubscribe it 2x, so compare the EP columns with each other, not with other machines.
# Usage: bench/moe_bench.sh [bytes] [speed]   (default both). Scratch: build/bench/moe/.
cd "$(dirname "$0")/.." || exit 2
B=build/bench/moe
mkdir -p "$B"
MPIRUN="mpirun --oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
what=${*:-bytes speed}
export RT_THREADS=${BENCH_THREADS:-1}

make -s --no-print-directory build/gen build/librt_cpu.a ref > "$B/make.log" 2>&1 ||
    { echo "make failed: $(tail -n 3 "$B/make.log")"; exit 1; }
mpicc -O2 -Wall -Wextra -shared -fPIC -o "$B/a2a_count.so" bench/moe_a2a_count.c ||
    { echo "cannot build the MPI counting shim"; exit 1; }
build/ref/make_tokens --vocab 256 --tokens 200000 --seed 3 "$B/tokens.bin" > /dev/null ||
    { echo "cannot make the token file"; exit 1; }

# build NAME GEN-ARGS...: $B/out/NAME/train
build() {
    local name=$1
    shift
    build/gen "$@" --out "$B/out/$name" > "$B/$name.gen.log" 2>&1 &&
    make -s --no-print-directory -j2 GEN_DIR="$B/out/$name" GEN_OBJ="$B/obj/$name" \
        "$B/out/$name/train" > "$B/$name.build.log" 2>&1 ||
        { echo "$name: generate/build failed: $(cat "$B/$name.gen.log" "$B/$name.build.log" |
                                                grep -m1 -E 'error|Error')"; return 1; }
}

# run NAME WORLD STEPS: train under the counting shim; log $B/NAME.jsonl, counts $B/NAME.a2a.*
run() {
    local name=$1 w=$2 steps=$3
    rm -f "$B/$name.a2a".*
    $MPIRUN -np "$w" -x RT_THREADS -x MOE_A2A_OUT="$B/$name.a2a" \
        -x LD_PRELOAD="$PWD/$B/a2a_count.so" "$B/out/$name/train" --quiet --data "$B/tokens.bin" \
        --steps "$steps" --log "$B/$name.jsonl" > "$B/$name.log" 2>&1 < /dev/null ||
        { echo "$name: run failed: $(grep -m1 -E 'error|rank' "$B/$name.log")"; return 1; }
}

# -- All-to-all bytes per step: measured against the analytic count ------------------------------

bytes_case() {   # name world steps gen-args...
    local name=$1 w=$2 steps=$3
    shift 3
    build "$name" "$@" && run "$name" "$w" "$steps" || return
    build/gen --lua bench/moe_traffic.lua "$@" > "$B/$name.analytic" ||
        { echo "$name: moe_traffic.lua failed"; return; }
    # measured: a2a lines of every rank; the group kind from the analytic file's group lines
    cat "$B/$name.a2a".* | awk -v steps="$steps" -v name="$name" -v af="$B/$name.analytic" '
        BEGIN {
            while ((getline line < af) > 0) {
                split(line, f, " ")
                if (f[1] == "group") kind[f[3]] = f[2]
                else if (f[1] == "rank") { asent[f[3]] += f[4]; aoff[f[3]] += f[5] }
            }
        }
        $1 == "a2a" {
            k = ($2 in kind) ? kind[$2] : "other"
            if ($3 == "f32") { msent[k] += $5; moff[k] += $6 } else { ints[k] += $5 }
        }
        END {
            n = split("ep expt-tp", ks, " ")
            for (i = 1; i <= n; i++) {
                k = ks[i]
                if (asent[k] == 0 && msent[k] == 0) continue
                ms = msent[k] / steps; mo = moff[k] / steps
                printf "%-34s %-8s %12.0f %12.0f %8s %12.0f %12.0f %6.3f %9.0f\n", name, k, ms,
                       asent[k], (ms == asent[k]) ? "exact" : sprintf("%.4f", ms / asent[k]),
                       mo, aoff[k], (aoff[k] > 0) ? mo / aoff[k] : 0, ints[k] / steps
            }
            if (msent["other"] > 0) printf "%-34s unmatched communicator: %.0f bytes/step\n",
                                           name, msent["other"] / steps
        }'
}

if [[ " $what " == *" bytes "* ]]; then
    echo "all-to-all bytes per step, summed over the world (f32 payload; balanced = analytic)"
    printf "%-34s %-8s %12s %12s %8s %12s %12s %6s %9s\n" layout group "sent" "analytic" \
           "ratio" "off-rank" "balanced" "ratio" "i32 B"
    bytes_case tiny_moe-dp2-ep2 2 3 tiny_moe --dp 2 --ep 2 --mbs 2 --nmb 2
    bytes_case tiny_moe-tp4-pp2-ep4-etp1-sp 8 3 \
        tiny_moe --tp 4 --pp 2 --sp --ep 4 --etp 1 --mbs 2 --nmb 2
    bytes_case tiny_moe-tp2-dp2-ep2-etp2-sp 4 3 \
        tiny_moe --tp 2 --dp 2 --sp --ep 2 --etp 2 --mbs 2 --nmb 2
    bytes_case tiny_moe-tp2-dp4-ep4-etp2-sp 8 3 \
        tiny_moe --tp 2 --dp 4 --sp --ep 4 --etp 2 --mbs 2 --nmb 1
    bytes_case tiny_moe-dp2-ep1-etp2 2 3 tiny_moe --dp 2 --ep 1 --etp 2 --mbs 2 --nmb 2
    bytes_case bench-dp4-ep4 4 3 bench/models/moe_bench.lua --dp 4 --ep 4 --mbs 2 --nmb 2
    echo
fi

# -- Tokens per second at EP 1, 2, 4 for a fixed global batch --------------------------------------

median_tok_s() {   # jsonl: median tok_s over the steps after the first two
    awk 'NR > 2 && match($0, /"tok_s":[0-9.eE+-]+/) { print substr($0, RSTART + 8, RLENGTH - 8) }' \
        "$1" | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"
        else if (NR % 2) printf "%.0f", v[(NR + 1) / 2]
        else printf "%.0f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
per_rank_bytes() {   # name world: off-rank f32 all-to-all bytes per rank per step (measured)
    cat "$B/$1.a2a".* 2> /dev/null | awk -v w="$2" -v s="$3" '$1 == "a2a" && $3 == "f32" { o += $6 }
        END { printf "%.0f", o / w / s }'
}

if [[ " $what " == *" speed "* ]]; then
    STEPS=${BENCH_STEPS:-12}
    REPEAT=${BENCH_REPEAT:-2}
    M=bench/models/moe_bench.lua
    # "name|label|gen-args": every layout is built once, then run REPEAT times in turn (so a
    # burst of load elsewhere hits one run, not one layout); the best median is reported
    LAYOUTS=()
    for ep in 1 2 4; do
        LAYOUTS+=("bench-dp4-ep$ep|dp4 ep$ep|$M --dp 4 --ep $ep --mbs 2 --nmb 2")
    done
    for ep in 1 2 4; do
        LAYOUTS+=("bench-tp2-dp2-ep$ep-sp|tp2 dp2 sp ep$ep etp1|$M --tp 2 --dp 2 --sp --ep $ep \
--etp 1 --mbs 2 --nmb 4")
    done
    declare -A BEST RUNS_OF
    for l in "${LAYOUTS[@]}"; do
        IFS='|' read -r name _ args <<< "$l"
        # shellcheck disable=SC2086
        build "$name" $args || continue
        BEST[$name]=0
    done
    for rep in $(seq "$REPEAT"); do
        for l in "${LAYOUTS[@]}"; do
            IFS='|' read -r name _ _ <<< "$l"
            [ -n "${BEST[$name]}" ] && run "$name" 4 "$STEPS" || continue
            t=$(median_tok_s "$B/$name.jsonl")
            RUNS_OF[$name]="${RUNS_OF[$name]} $t"
            [ "$t" != - ] && [ "$t" -gt "${BEST[$name]}" ] && BEST[$name]=$t
        done
    done
    echo "tokens/s, $M, global batch 16 x 128 tokens (mbs 2), $STEPS steps," \
         "RT_THREADS=$RT_THREADS, best median of $REPEAT runs"
    printf "%-24s %5s %8s %-16s %26s\n" layout world "tok/s" "(each run)" \
           "a2a off-rank B/rank/step"
    for l in "${LAYOUTS[@]}"; do
        IFS='|' read -r name label _ <<< "$l"
        [ -n "${BEST[$name]}" ] || continue
        printf "%-24s %5d %8s %-16s %26s\n" "$label" 4 "${BEST[$name]}" "(${RUNS_OF[$name]# })" \
               "$(per_rank_bytes "$name" 4 "$STEPS")"
    done
fi
