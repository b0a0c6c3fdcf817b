#!/bin/bash
# bench/cp_bench.sh: context parallelism (CP, docs/megatron.md §12) on the CPU backend; not part
# of make test. Each sequence of SEQ positions is cut into 2*CP chunks, cp rank r holds chunks r
# and 2*CP-1-r, and attention runs around a p2p ring (lib/model.c ring_fwd, ring_bwd). Prints:
#  1. ring traffic: the bytes one rank sends on the ring per step, measured twice (the runtime's
#     trace, RT_TRACE, tags 2 = K|V and 3 = dK|dV; and what reached MPI_Isend with those tags on
#     the runtime's point-to-point communicator, "p2p", counted by the PMPI shim
#     bench/parallel_mpicount.c: the runtime's own collectives, MPI_Isend too, travel on their
#     groups' communicators, and nothing else may use "p2p") against the generator's
#     declaration (--dump program, summed by bench/cp_ring.lua) and the closed form per layer
#     and micro-batch
#        forward  (CP-1) * N*2*C_LOCAL * es
#        backward (CP-1) * N*2*C_LOCAL * (es+4) + N*2*C_LOCAL * 4
#     with N = MBS*SEQ/CP, C_LOCAL = hidden/TP, es = 4 (f32) or 2 (bf16): CP-1 hops carry the
#     other ranks' K|V blocks; the backward sends them round again with their f32 dK|dV, and one
#     last hop brings each block's dK|dV home. Every ratio must be exactly 1.0000 (else exit 1);
# 1b. all-to-all traffic (CP_COMM=a2a, no ring): the bytes one rank sends to the other cp ranks
#     per step, measured by a PMPI shim on MPI_Alltoallv (bench/moe_a2a_count.c, used as is: the
#     send counts less the rank's own block; the CPU runtime's rt_alltoall is one
#     MPI_Alltoallv), against the closed form per layer and micro-batch
#        forward = backward = (CP-1) * N * (C_LOCAL/CP) * es * 4
#     (forward q|k|v, 3 parts, out and the output back; backward the output gradient out and
#     dq|dk|dv back; each a 1/CP share of the columns, a head group, to each other cp rank), and
#     the call count against RT_TRACE and --dump program's alltoall records; exactly 1.0000;
#  2. tokens/s at a fixed global batch (DP 1, same MBS, same steps) for CP 1, 2 and 4, tiny and
#     the long-sequence model, with the ratio to CP 1;
#  3. the long sequence (bench/models/cp_long.lua, SEQ 8192): the memory plan per rank
#     (--dump memory, bench/cp_mem.lua) for CP 1, 2, 4, and 3 steps of CP 4 that train.
# One thread per rank (RT_THREADS=1; BENCH_THREADS=n to change). Usage: bench/cp_bench.sh
# [traffic] (traffic: sections 1 and 1b only, ~30 s; ROUNDS=n: tiny's throughput rounds,
# default 3). Scratch and raw logs: build/bench/cp/.
# About 85 s on the quiet 2-core dev VM (1b: ~5 s of it), ~2 minutes while other jobs run;
# timings on a shared VM vary ~15 % (and far more while other jobs run: such rows are marked '*').
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/bench/cp
mkdir -p "$B"
export RT_THREADS=${BENCH_THREADS:-1}
ROUNDS=${ROUNDS:-3}
what=${1:-all}
[ "$what" = all ] || [ "$what" = traffic ] ||
    { echo "usage: bench/cp_bench.sh [traffic]" >&2; exit 2; }
t_start=$(date +%s)

# mpirun as tests/lib.sh runs it: oversubscribed, shared memory between the ranks, as root
# where need be; no binding, so 4 ranks share the 2 cores as the scheduler sees fit
MPIRUN=(mpirun --oversubscribe --bind-to none)
if ompi_info 2> /dev/null | grep 'MCA btl: vader' > /dev/null; then
    MPIRUN+=(--mca pml ob1 --mca btl "self,vader")
fi
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)

echo "cp_bench: $(date '+%Y-%m-%d %H:%M %Z'); CPU: $(lscpu | sed -n 's/^Model name: *//p')," \
     "$(nproc) cores; $(mpirun --version 2> /dev/null | head -n 1);" \
     "load $(cut -d' ' -f1-3 /proc/loadavg)"

make -s --no-print-directory build/gen build/librt_cpu.a ref > "$B/make.log" 2>&1 ||
    { echo "make failed: $(tail -n 3 "$B/make.log")"; exit 1; }
mpicc -O2 -shared -fPIC -o "$B/mpicount.so" bench/parallel_mpicount.c ||
    { echo "cannot build the MPI counting shim"; exit 1; }
mpicc -O2 -shared -fPIC -o "$B/a2a_count.so" bench/moe_a2a_count.c ||
    { echo "cannot build the MPI_Alltoallv counting shim"; exit 1; }
build/ref/make_tokens --vocab 256 --tokens 200000 --seed 3 "$B/tokens.bin" > /dev/null

# -- Helpers ---------------------------------------------------------------------------------------

# build NAME GEN-ARGS...: generate into $B/out/NAME and build its train program
build() {
    local name=$1
    shift
    build/gen "$@" --out "$B/out/$name" > "$B/$name.gen.log" 2>&1 ||
        { echo "$name: build/gen $*: $(grep -m1 error "$B/$name.gen.log")"; exit 1; }
    make -s --no-print-directory -j2 GEN_DIR="$B/out/$name" GEN_OBJ="$B/obj/$name" \
        "$B/out/$name/train" > "$B/$name.build.log" 2>&1 ||
        { echo "$name: build failed: $(grep -m1 error "$B/$name.build.log")"; exit 1; }
}

world_of() {
    sed -n 's/^{"model": "[^"]*", "world": \([0-9]*\),.*/\1/p' "$B/out/$1/topology.json"
}

# launch NAME LOG VAR=VALUE... -- TRAIN-ARGS...: the program of NAME on its world (directly when
# 1), with RT_THREADS and the environment given (later wins; mpirun -x passes each name to every
# rank), stdin closed, output in LOG; then its memory line must read
# "memory: planned P bytes, allocated A bytes (stage 0)" with P == A
launch() {
    local name=$1 log=$2 w env=(RT_THREADS="$RT_THREADS") mpienv=(-x RT_THREADS)
    shift 2
    while [ "$1" != -- ]; do env+=("$1"); mpienv+=(-x "${1%%=*}"); shift; done
    shift
    w=$(world_of "$name")
    if [ "$w" = 1 ]; then
        env "${env[@]}" timeout 600 "$B/out/$name/train" "$@" > "$log" 2>&1 < /dev/null
    else
        env "${env[@]}" timeout 600 "${MPIRUN[@]}" -np "$w" "${mpienv[@]}" \
            "$B/out/$name/train" "$@" > "$log" 2>&1 < /dev/null
    fi || { echo "$name: run failed: $(grep -m1 -E 'error|rank' "$log")"; exit 1; }
    awk '/^memory: planned / { n++; if ($3 != $6) bad = 1 } END { exit !(n == 1 && !bad) }' \
        "$log" || { echo "$name: memory plan not met: $(grep -m1 memory: "$log")"; exit 1; }
}

# median of the numbers on stdin, one a line
median() {
    sort -g | awk '{ v[NR] = $1 }
        END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", b ? a / b : 0 }'; }

# -- 1. Ring traffic -------------------------------------------------------------------------------
# tiny: 8 layers, hidden 64, SEQ 64. A layout runs STEPS steps traced and counted; a step's ring
# traffic is the run's / STEPS (nothing before the first step uses the ring: tests/program's
# trace check sees only the data check's all-reduce there). Every rank sends the same on a ring:
# each must match, the table shows rank 0.

STEPS=3
L=8 C=64 SEQ=64
bad=0
: > "$B/ring_layer.txt"
: > "$B/ring_step.txt"

# ring NAME TP CP MBS NMB ES GEN-FLAGS...: build, dump, run, compare; one row in each table
ring() {
    local name=$1 tp=$2 cp=$3 mbs=$4 nmb=$5 es=$6 w r
    shift 6
    build "$name" tiny --tp "$tp" --cp "$cp" --mbs "$mbs" --nmb "$nmb" "$@"
    w=$(world_of "$name")
    # declared: per step (F and B ops) and per layer and micro-batch
    build/gen tiny --tp "$tp" --cp "$cp" --mbs "$mbs" --nmb "$nmb" "$@" --dump program \
        > "$B/$name.program.json"
    build/gen --lua bench/cp_ring.lua "$B/$name.program.json" > "$B/$name.ring"
    local d_fwd d_bwd d_tag2 d_tag3 hops l_fwd l_bwd calls
    read -r _ d_fwd d_bwd d_tag2 d_tag3 hops < <(grep '^step' "$B/$name.ring")
    read -r _ l_fwd l_bwd calls < <(grep '^layer' "$B/$name.ring")
    local dump=$((d_fwd + d_bwd))
    # closed form, per layer and micro-batch, and per step (L layers x NMB micro-batches)
    local N=$((mbs * SEQ / cp)) cl=$((C / tp))
    local c_fwd=$(((cp - 1) * N * 2 * cl * es))
    local c_bwd=$(((cp - 1) * N * 2 * cl * (es + 4) + N * 2 * cl * 4))
    local closed=$((L * nmb * (c_fwd + c_bwd)))
    [ "$calls" = $((L * nmb)) ] || { echo "$name: $calls layer_fwd calls, not L*NMB"; bad=1; }
    # measured: traced sends on tags 2 and 3, and the shim's MPI_Isend bytes with those tags on
    # "p2p" (other sends there: "other", must be none), per rank
    rm -rf "$B/$name.trace" "$B/$name.count".*
    mkdir -p "$B/$name.trace"
    launch "$name" "$B/$name.run.log" RT_TRACE="$B/$name.trace" \
        MPICOUNT_OUT="$B/$name.count" LD_PRELOAD="$PWD/$B/mpicount.so" -- \
        --data "$B/tokens.bin" --steps "$STEPS" --quiet
    local t2=0 t3=0 mpi=0 other=0 tr m
    for ((r = w - 1; r >= 0; r--)); do        # rank 0 last: its numbers are the row's
        read -r t2 t3 < <(awk '$1 == "p2p" { for (i = 2; i + 4 <= NF; i += 5)
                if ($i == "send") { b = $(i + 2) * ($(i + 3) == "bf16" ? 2 : 4)
                                    if ($(i + 4) == 2) t2 += b; if ($(i + 4) == 3) t3 += b } }
            END { printf "%d %d\n", t2, t3 }' "$B/$name.trace/rank_$(printf %05d "$r").trace")
        read -r mpi other < <(awk '$2 != "p2p" { next }
                $1 == "send@tag2" || $1 == "send@tag3" { s += $5 }
                $1 == "send" || $1 == "send.bf16" { all += $5 }
                END { printf "%d %d\n", s, all - s }' "$B/$name.count.$r")
        tr=$(((t2 + t3) / STEPS)) m=$((mpi / STEPS))
        if [ "$tr" != "$dump" ] || [ "$m" != "$dump" ] || [ $((t2 % STEPS + t3 % STEPS)) != 0 ] ||
           [ "$other" != 0 ]; then
            echo "$name: rank $r sent $tr bytes a step (traced), $m (MPI, $other more on p2p" \
                 "with other tags); declared $dump"
            bad=1
        fi
    done
    if [ "$((t2 / STEPS))" != "$d_tag2" ] || [ "$((t3 / STEPS))" != "$d_tag3" ]; then
        echo "$name: by tag traced $((t2 / STEPS)) + $((t3 / STEPS)), declared $d_tag2 + $d_tag3"
        bad=1
    fi
    if [ "$dump" != "$closed" ] || [ "$l_fwd" != "$c_fwd" ] || [ "$l_bwd" != "$c_bwd" ]; then
        echo "$name: declared $l_fwd + $l_bwd a layer, $dump a step; closed form $c_fwd +" \
             "$c_bwd, $closed"
        bad=1
    fi
    printf "%-16s %3d %3d %5d %4d %3d | %10d %10d | %10d %10d | %7s %7s\n" "$name" "$cp" "$tp" \
        "$N" "$cl" "$es" "$l_fwd" "$c_fwd" "$l_bwd" "$c_bwd" "$(ratio "$l_fwd" "$c_fwd")" \
        "$(ratio "$l_bwd" "$c_bwd")" >> "$B/ring_layer.txt"
    printf "%-16s %5d %5d %4d | %9d %9d %9d %9d | %9d %9d | %7s %7s %7s\n" "$name" "$w" \
        $((L * nmb)) "$hops" $((t2 / STEPS)) $((t3 / STEPS)) "$tr" "$m" "$dump" "$closed" \
        "$(ratio "$tr" "$dump")" "$(ratio "$m" "$dump")" "$(ratio "$tr" "$closed")" \
        >> "$B/ring_step.txt"
}

ring tiny-cp2         1 2 4 1 4
ring tiny-cp4         1 4 4 1 4
ring tiny-cp2-bf16    1 2 4 2 2 --bf16
ring tiny-tp2-sp-cp2  2 2 4 1 4 --sp

echo
echo "== 1. Ring traffic of tiny (8 layers, hidden 64, SEQ 64), bytes one rank sends on the cp ring"
echo "   declared per layer and micro-batch (build/gen --dump program, one layer_fwd / layer_bwd"
echo "   call's ring records: n*es + n2*4) against the closed form; N = MBS*SEQ/CP tokens,"
echo "   C_LOCAL = hidden/TP, es = bytes of a K|V element (f32 4, bf16 2)"
printf "%-16s %3s %3s %5s %4s %3s | %10s %10s | %10s %10s | %7s %7s\n" layout CP TP N C_LC es \
    "fwd dump" "fwd closed" "bwd dump" "bwd closed" "fwd" "bwd"
cat "$B/ring_layer.txt"
echo
echo "   measured per rank and step ($STEPS steps / $STEPS; every rank alike, rank 0 shown): K|V"
echo "   (tag 2, forward and backward) and dK|dV (tag 3) from RT_TRACE, their sum, and the bytes"
echo "   MPI_Isend was given with tags 2 and 3 on the runtime's p2p communicator (PMPI shim; no"
echo "   other tag there); against the step's ring records in --dump program (\"hops\" of them)"
echo "   and the closed form x layers x micro-batches (L*NMB)"
printf "%-16s %5s %5s %4s | %9s %9s %9s %9s | %9s %9s | %7s %7s %7s\n" layout ranks L*NMB \
    hops "K|V tr" "dK|dV tr" traced MPI_Isend dump closed tr/dump mpi/dmp tr/clsd
cat "$B/ring_step.txt"
if [ "$bad" = 0 ]; then
    echo "   ok: every measured count equals the declared and the closed-form count (1.0000)"
else
    echo "   FAILED: a measured count differs from the analytic one (above)"
fi

# -- 1b. All-to-all traffic (CP_COMM=a2a) ----------------------------------------------------------
# The same tiny layouts with --cp-comm a2a: per attention layer and micro-batch two all-to-alls
# over cp forward (q|k|v by head group out, the attention output back) and two backward (the
# output gradient out, dq|dk|dv back); the layer (gen/lua/layer.lua) calls rt_alltoall, equal
# blocks, one per cp rank, its own included, and the CPU runtime hands them to one
# MPI_Alltoallv. Bytes are measured by the shim (bench/moe_a2a_count.c: per communicator, the
# calls, the send counts' bytes and the same less the rank's own block) and compared with the
# closed form; the trace (alltoall lines on cp) and the dump (alltoall records) count the calls. A rank's own block must be 1/(CP-1) of what it sends the others
# (equal blocks), and no p2p traffic may be traced. Every rank is checked, rank 0 shown.

: > "$B/a2a.txt"
a2a_bad=0

# a2a NAME TP CP MBS NMB ES GEN-FLAGS...: build, dump, run, compare; one row
a2a() {
    local name=$1 tp=$2 cp=$3 mbs=$4 nmb=$5 es=$6 w r
    shift 6
    local gflags=(tiny --tp "$tp" --cp "$cp" --cp-comm a2a --mbs "$mbs" --nmb "$nmb" "$@")
    build "$name" "${gflags[@]}"
    w=$(world_of "$name")
    build/gen "${gflags[@]}" --dump program > "$B/$name.program.json"
    build/gen --lua bench/cp_ring.lua "$B/$name.program.json" > "$B/$name.ring"
    local d_f d_b l_f l_b ring_f ring_b
    read -r _ ring_f ring_b _ < <(grep '^step' "$B/$name.ring")
    read -r _ d_f d_b l_f l_b < <(grep '^a2a' "$B/$name.ring")
    local recs=$((d_f + d_b))
    # closed form, per layer and micro-batch (forward = backward), and per step
    local N=$((mbs * SEQ / cp)) cl=$((C / tp))
    local c_dir=$(((cp - 1) * N * (cl / cp) * es * 4))
    local closed=$((L * nmb * 2 * c_dir))
    if [ "$l_f" != 2 ] || [ "$l_b" != 2 ] || [ "$recs" != $((4 * L * nmb)) ] ||
       [ $((ring_f + ring_b)) != 0 ]; then
        echo "$name: --dump program declares $l_f + $l_b alltoall a layer, $recs a step" \
             "(not 2 + 2, 4*L*NMB), ring bytes $ring_f + $ring_b"
        bad=1 a2a_bad=1
    fi
    rm -rf "$B/$name.trace" "$B/$name.a2a".*
    mkdir -p "$B/$name.trace"
    launch "$name" "$B/$name.run.log" RT_TRACE="$B/$name.trace" \
        MOE_A2A_OUT="$B/$name.a2a" LD_PRELOAD="$PWD/$B/a2a_count.so" -- \
        --data "$B/tokens.bin" --steps "$STEPS" --quiet
    local tc=0 p2p=0 mc=0 mall=0 moff=0 nrec=0
    for ((r = w - 1; r >= 0; r--)); do        # rank 0 last: its numbers are the row's
        read -r tc p2p < <(awk '$1 ~ /^alltoallv?$/ && $2 == "cp" { n++ } $1 == "p2p" { p++ }
            END { printf "%d %d\n", n, p }' "$B/$name.trace/rank_$(printf %05d "$r").trace")
        # the shim's lines: "a2a <members> <dtype> <calls> <bytes> <off-rank>"; every one must be
        # on a group of CP members that holds this rank (the cp group: nothing else all-to-alls)
        read -r nrec mc mall moff < <(awk -v cp="$cp" -v r="$r" '$1 == "a2a" {
                k = split($2, m, ","); mine = 0
                for (i = 1; i <= k; i++) if (m[i] == r) mine = 1
                if (k != cp || !mine) bad = 1
                n++; c += $4; a += $5; o += $6 }
            END { printf "%d %d %d %d\n", bad ? -1 : n, c, a, o }' "$B/$name.a2a.$r")
        if [ "$nrec" -lt 1 ] || [ $((tc % STEPS + mc % STEPS + moff % STEPS)) != 0 ] ||
           [ $((tc / STEPS)) != "$recs" ] || [ $((mc / STEPS)) != "$recs" ] ||
           [ $((moff / STEPS)) != "$closed" ] || [ $(((mall - moff) * (cp - 1))) != "$moff" ] ||
           [ "$p2p" != 0 ]; then
            echo "$name: rank $r: $tc alltoall traced, $mc counted ($nrec communicators), $p2p" \
                 "p2p calls; $moff bytes to the others, $((mall - moff)) to itself, in" \
                 "$STEPS steps; per step declared $recs calls, closed form $closed bytes"
            bad=1 a2a_bad=1
        fi
    done
    printf "%-20s %5d %3d %3d %5d %4d %3d | %8d %8d | %5d %6d %6d | %9d %9d %9d | %7s %7s\n" \
        "$name" "$w" "$cp" "$tp" "$N" $((cl / cp)) "$es" "$c_dir" "$c_dir" "$recs" \
        $((tc / STEPS)) $((mc / STEPS)) $(((mall - moff) / STEPS)) $((moff / STEPS)) "$closed" \
        "$(ratio $((tc / STEPS)) "$recs")" "$(ratio $((moff / STEPS)) "$closed")" >> "$B/a2a.txt"
}

a2a tiny-a2a-cp2         1 2 4 1 4
a2a tiny-a2a-cp4         1 4 4 1 4
a2a tiny-a2a-cp2-bf16    1 2 4 2 2 --bf16
a2a tiny-a2a-tp2-sp-cp2  2 2 4 1 4 --sp

echo
echo "== 1b. All-to-all traffic of tiny with CP_COMM=a2a (heads 4: TP 2 allows CP 2), per rank and"
echo "   step ($STEPS steps / $STEPS; every rank alike, rank 0 shown). Closed form per layer and"
echo "   micro-batch: fwd = bwd = (CP-1)*N*HW*es*4 bytes to the other cp ranks, HW = C_LOCAL/CP"
echo "   (a head group's columns); calls: alltoall records on cp in --dump program, RT_TRACE's"
echo "   alltoall lines on cp, MPI_Alltoallv calls (PMPI shim); bytes (shim): the rank's own"
echo "   block and what it sends to the others, against the closed form x L*NMB (both directions)"
printf "%-20s %5s %3s %3s %5s %4s %3s | %8s %8s | %5s %6s %6s | %9s %9s %9s | %7s %7s\n" \
    layout ranks CP TP N HW es "fwd/lyr" "bwd/lyr" dump traced MPI own "to others" closed \
    tr/dump mpi/cls
cat "$B/a2a.txt"
if [ "$a2a_bad" = 0 ]; then
    echo "   ok: calls traced and counted = declared, bytes to the other ranks = closed form"
    echo "   (1.0000), each rank's own block = 1/(CP-1) of them, no p2p traffic"
else
    echo "   FAILED: a measured count differs from the analytic one (above)"
fi

if [ "$what" = traffic ]; then
    echo
    echo "cp_bench: $(($(date +%s) - t_start)) s"
    exit "$bad"
fi

# -- 2. Throughput at a fixed global batch ---------------------------------------------------------
# DP 1, the same micro-batch, steps and global batch for every CP; one thread per rank, so CP 1
# uses one core, CP 2 both, CP 4 puts 4 ranks on the 2 cores. The row of CP 1 with 2 threads runs
# the one rank with a 2-thread pool on the same 2 cores CP 2 uses. tokens/s: the median over the
# steps after the first SKIP, from the program's --log (JSONL, tok_s = global tokens / step
# time); tiny takes the best median of ROUNDS interleaved rounds (other load only ever slows a run
# down). Beside it, what a rank sends a step as declared (--dump program): on the ring, and the
# gradients the cp ranks all-reduce (they are data-parallel replicas of the weights). A run
# started while other processes kept the CPUs more than 10 % busy is marked '*'.

: > "$B/tput.txt"

# busy: percent of the CPUs' time spent over the next second (called between our runs: others')
busy() {
    local a b a1 a2 a3 a4 a5 a6 a7 b1 b2 b3 b4 b5 b6 b7
    read -r _ a1 a2 a3 a4 a5 a6 a7 _ < /proc/stat
    sleep 1
    read -r _ b1 b2 b3 b4 b5 b6 b7 _ < /proc/stat
    a=$(((b1 - a1) + (b2 - a2) + (b3 - a3) + (b6 - a6) + (b7 - a7)))
    b=$((a + (b4 - a4) + (b5 - a5)))
    echo $((100 * a / (b + 1)))
}

# tput MODEL SEQ MBS STEPS SKIP ROUNDS: one table block (CP 1 at 1 and 2 threads, CP 2, CP 4)
tput() {
    local model=$1 seq=$2 mbs=$3 steps=$4 skip=$5 rounds=$6 short cfg name cp thr t m u
    local cfgs="1:1 1:2 2:1 4:1"                     # CP:threads per rank
    short=$(basename "$model" .lua)
    declare -A best=() ms=() rbytes=() gbytes=() load=()
    for cp in 1 2 4; do
        name=$short-t$seq-cp$cp
        build "$name" "$model" --cp "$cp" --mbs "$mbs" --seq "$seq"
        build/gen "$model" --cp "$cp" --mbs "$mbs" --seq "$seq" --dump program \
            > "$B/$name.program.json"
        build/gen --lua bench/cp_ring.lua "$B/$name.program.json" > "$B/$name.ring"
        rbytes[$cp]=$(awk '$1 == "step" { print $2 + $3 }' "$B/$name.ring")
        gbytes[$cp]=$(awk '$1 == "grad" { print $2 }' "$B/$name.ring")
    done
    for ((i = 0; i < rounds; i++)); do
        for cfg in $cfgs; do
            cp=${cfg%:*} thr=${cfg#*:} name=$short-t$seq-cp$cp
            u=$(busy)
            [ "$u" -gt "${load[$cfg]:-0}" ] && load[$cfg]=$u
            launch "$name" "$B/$name.thr$thr.log" RT_THREADS="$thr" -- --data "$B/tokens.bin" \
                --steps "$steps" --quiet --log "$B/$name.thr$thr.jsonl"
            t=$(sed -n 's/.*"tok_s":\([0-9.]*\).*/\1/p' "$B/$name.thr$thr.jsonl" |
                tail -n +$((skip + 1)) | median)
            m=$(sed -n 's/.*"ms":\([0-9.]*\).*/\1/p' "$B/$name.thr$thr.jsonl" |
                tail -n +$((skip + 1)) | median)
            if [ -z "${best[$cfg]:-}" ] ||
               awk -v a="$t" -v b="${best[$cfg]}" 'BEGIN { exit !(a > b) }'; then
                best[$cfg]=$t ms[$cfg]=$m
            fi
        done
    done
    for cfg in $cfgs; do
        cp=${cfg%:*} thr=${cfg#*:}
        local note=""
        [ "$cfg" = 1:2 ] && note="the 2 cores of CP 2, as threads"
        [ "$cp" -gt "$(nproc)" ] && note="$cp ranks on $(nproc) cores: oversubscribed"
        awk -v m="$short" -v s="$seq" -v b="$mbs" -v cp="$cp" -v thr="$thr" -v ms="${ms[$cfg]}" \
            -v t="${best[$cfg]}" -v one="${best[1:1]}" -v note="$note" -v nc="$(nproc)" \
            -v ring="${rbytes[$cp]}" -v grad="${gbytes[$cp]}" -v busy="${load[$cfg]:-0}" 'BEGIN {
            cores = cp * thr < nc ? cp * thr : nc
            printf "%-8s %5d %3d %2d %3d %5d | %8.2f %8.2f | %9.1f %8.0f%1s | %7.2f%s\n", m, s,
                   b, cp, thr, cores, ring / 1048576, grad / 1048576, ms, t,
                   (busy > 10 ? "*" : ""), t / one, (note != "" ? "  " note : "") }' \
            >> "$B/tput.txt"
    done
}

tput tiny 64 8 30 5 "$ROUNDS"
tput bench/models/cp_long.lua 8192 1 4 1 1

echo
echo "== 2. Throughput at a fixed global batch (DP 1, NMB 1, the same MBS and steps for every CP;"
echo "   ms/step and tok/s: medians of the steps after the warm-up, tiny: best of $ROUNDS rounds of"
echo "   25 steps, cp_long: 3 steps); vs CP 1 = tok/s / CP 1's with one thread; ring, grad AR: MiB"
echo "   a rank sends on the cp ring and all-reduces over dp-cp per step (--dump program)"
printf "%-8s %5s %3s %2s %3s %5s | %8s %8s | %9s %9s | %7s\n" model SEQ MBS CP thr cores \
    ring "grad AR" "ms/step" "tok/s" "vs CP 1"
cat "$B/tput.txt"
grep -q '\*' "$B/tput.txt" && echo "   * other processes kept the CPUs > 10 % busy when a run of" \
    "this row started: not to be trusted"
echo "   With $(nproc) cores CP 4 runs 4 ranks on $(nproc) cores (oversubscribed): its ratio"
echo "   measures what the ring costs (smaller attention blocks, CP-1 = 3 ring hops a layer"
echo "   forward and more backward, 4 ranks time-sharing 2 cores), not a speed-up. CP 2"
echo "   against CP 1 with 2 threads compares the same cores. tiny's chunks (SEQ/(2*CP) = 16 or"
echo "   8 positions) leave attention little to divide, while the cp ranks add ring hops and"
echo "   the gradients' all-reduce; at SEQ 8192 attention dominates the step and CP 2 splits"
echo "   it between the cores."

# -- 3. The long sequence --------------------------------------------------------------------------
# The same model at CP 1, 2, 4 as planned by the generator (bytes per rank on the CPU backend,
# the plan every program checks at start), then 3 steps of CP 4 with their losses and memory line.

LONG=bench/models/cp_long.lua
echo
echo "== 3. Long sequence: $LONG (4 layers, hidden 64, SEQ 8192), MBS 1:"
echo "   memory per rank planned by build/gen --dump memory (CPU, MiB); state = parameters,"
echo "   gradients and optimizer state (replicated over cp); comm = the ring's K|V and dK|dV"
echo "   buffers"
printf "%3s | %12s %9s %10s %9s %10s | %14s %14s\n" CP activations comm workspace state total \
    "act CP1/CPk" "total CP1/CPk"
declare -A act=() tot=()
for cp in 1 2 4; do
    build/gen "$LONG" --cp "$cp" --mbs 1 --dump memory > "$B/long-cp$cp.memory.json"
    read -r a c w s t < <(build/gen --lua bench/cp_mem.lua "$B/long-cp$cp.memory.json")
    act[$cp]=$a tot[$cp]=$t
    awk -v cp="$cp" -v a="$a" -v c="$c" -v w="$w" -v s="$s" -v t="$t" -v a1="${act[1]}" \
        -v t1="${tot[1]}" 'BEGIN { M = 1048576
        printf "%3d | %12.2f %9.2f %10.2f %9.2f %10.2f | %14.4f %14.4f\n", cp, a / M, c / M,
               w / M, s / M, t / M, a1 / a, t1 / t }'
done
echo
echo "   CP 4 trains (mpirun -np 4, one thread per rank, 3 steps):"
launch cp_long-t8192-cp4 "$B/long-cp4.train.log" -- --data "$B/tokens.bin" --steps 3
sed 's/^/     /' "$B/long-cp4.train.log"
planned=$(awk '/^memory: planned / { print $3 }' "$B/long-cp4.train.log")
if [ "$planned" = "${tot[4]}" ]; then
    echo "   planned == allocated, and == --dump memory's total for CP 4 (${tot[4]} bytes)"
else
    echo "   FAILED: the run planned $planned bytes, --dump memory says ${tot[4]}"
    bad=1
fi
awk -v a1="${act[1]}" -v a4="${act[4]}" -v t1="${tot[1]}" -v t4="${tot[4]}" 'BEGIN {
    M = 1048576
    printf "   Without CP one rank would hold %.2f x the activation memory of a CP 4 rank\n", \
        a1 / a4
    printf "   (%.1f MiB instead of %.1f MiB): activations scale with the positions a rank\n", \
        a1 / M, a4 / M
    printf "   holds, SEQ/CP; the replicated state does not, so the total per rank falls\n"
    printf "   %.2f x (%.1f MiB to %.1f MiB).\n", t1 / t4, t1 / M, t4 / M }'

echo
echo "cp_bench: $(($(date +%s) - t_start)) s"
exit "$bad"
