#!/bin/bash
# bench/parallel_bench.sh: tensor / data parallelism and the distributed optimizer on the CPU
# backend (not part of make test). For a fixed global batch at world 1, 2 and 4:
#   tokens/s    median over the steps after the first, from the program's --log, best of
#               BENCH_REPEAT runs (tiny 3, gpt2 1);
#   bytes       what rank 0 hands MPI per step on each communicator, counted by an MPI
#               profiling shim (bench/parallel_mpicount.c, LD_PRELOAD; a 1-step run is
#               subtracted so only whole steps count). The CPU runtime (runtime/rt_mpi.c) runs
#               its all-reduces, reduce-scatters and all-gathers itself, as MPI_Isend /
#               MPI_Irecv on the group's communicator (rt_p2p on a communicator of its own,
#               "p2p"), so the bytes rank 0 sends on a group's communicator are the bytes it
#               moves for that group (its receives, equal for these algorithms, beside them).
#               Against the analytic count: Megatron's regions (docs/megatron.md §4-6, worked
#               out below), call by call, each moved as the runtime's algorithm moves it. A
#               collective of payload N bytes (es-byte elements) over p ranks sends from group
#               rank r (rank 0 is group rank 0 in each of its groups):
#                 reduce-scatter, all-gather  N(p-1)/p   (its block to each peer; N = the whole
#                                                         buffer, p blocks)
#                 all-reduce, N <= 4096       N(p-1)     (the whole buffer to every peer, each
#                                                         reduces all of it: SMALL_BYTES)
#                 all-reduce, N > 4096        per slice of l elements, (l + (p-2) l_r) es:
#                     slices of p*m elements (the last one shorter), m = floor(2^20/((p-1) es))
#                     (SLOT_BYTES); member b reduces elements [floor(l b/p), floor(l (b+1)/p))
#                     of a slice, l_b of them: r sends each peer its block (l - l_r), then its
#                     reduced block to every peer ((p-1) l_r); 2N(p-1)/p when p divides every
#                     slice, the ring's bytes;
#               and the ring formulas beside them (all-reduce 2N(p-1)/p, reduce-scatter and
#               all-gather N(p-1)/p): on 2 ranks the same, on more the small all-reduces
#               (loss, norm, the logits' maximum) move more;
#   memory      each rank's peak resident set (VmHWM) with and without DIST_OPT, its
#               difference against what the optimizer state should save, and the byte
#               table of docs/megatron.md §5.7;
#   bf16        (tiny) the same counts for pairs of layouts trained in f32 and with --bf16
#               (TP, TP+SP, PP, DP+DIST_OPT), as the ratio bf16 / f32 per communicator and op.
# Each rank runs one thread (RT_THREADS=1; BENCH_THREADS=n to change): world 1 uses one core,
# world 2 both cores of the dev VM, world 4 oversubscribes them 2x. (On a shared machine a
# 2-thread pool per rank loses badly to other load: its workers wait for each other.)
# Usage: bench/parallel_bench.sh [tiny] [gpt2] [bf16]   (default: all; gpt2 takes a few minutes)
# Scratch and raw numbers: build/bench/parallel/. Timings on a shared 2-core VM vary ~15 %.
cd "$(dirname "$0")/.." || exit 2
B=build/bench/parallel
mkdir -p "$B"
MPIRUN="mpirun --oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
what=${*:-tiny gpt2 bf16}
export RT_THREADS=${BENCH_THREADS:-1}

make -s --no-print-directory build/gen build/librt_cpu.a ref > "$B/make.log" 2>&1 ||
    { echo "make failed: $(tail -n 3 "$B/make.log")"; exit 1; }
mpicc -O2 -shared -fPIC -o "$B/mpicount.so" bench/parallel_mpicount.c ||
    { echo "cannot build the MPI counting shim"; exit 1; }

# -- One layout: generate, build, run (steps 0 and K, counted), summarise --------------------

# layout MODEL_ARG NAME TP DP MBS SP DISTOPT -> generates $B/out/NAME, builds train
build() {
    local model=$1 name=$2 tp=$3 dp=$4 mbs=$5 sp=$6 dop=$7 args
    args="$model --tp $tp --dp $dp --mbs $mbs"
    [ "$sp" = 1 ] && args="$args --sp"
    [ "$dop" = 1 ] && args="$args --dist-opt"
    args="$args $EXTRA"         # more generator flags (the bf16 section)
    # shellcheck disable=SC2086
    build/gen $args $SEQ_ARG --out "$B/out/$name" > "$B/$name.gen.log" 2>&1 &&
    make -s --no-print-directory -j2 GEN_DIR="$B/out/$name" GEN_OBJ="$B/obj/$name" \
        "$B/out/$name/train" > "$B/$name.build.log" 2>&1
}

# run NAME WORLD STEPS TAG: the program under the counting shim; counts in $B/NAME.TAG.<rank>
run() {
    local name=$1 w=$2 steps=$3 tag=$4 extra=()
    [ "$steps" -gt 0 ] && extra=(--data "$DATA" --log "$B/$name.jsonl")
    if [ "$w" = 1 ]; then
        MPICOUNT_OUT="$B/$name.$tag" LD_PRELOAD="$PWD/$B/mpicount.so" \
            "$B/out/$name/train" --quiet --steps "$steps" "${extra[@]}" $INIT_ARG \
            > "$B/$name.$tag.log" 2>&1 < /dev/null
    else
        $MPIRUN -np "$w" -x RT_THREADS -x MPICOUNT_OUT="$B/$name.$tag" \
            -x LD_PRELOAD="$PWD/$B/mpicount.so" \
            "$B/out/$name/train" --quiet --steps "$steps" "${extra[@]}" $INIT_ARG \
            > "$B/$name.$tag.log" 2>&1 < /dev/null
    fi
}

# Elements per rank in the gradient buffer(s) of rank 0's class (padded as the layout pads).
buffer_size() {
    build/gen --lua tests/parallel/shards_check.lua "$B/out/$1/shards.json" |
        awk '$1 == "buffer" && $2 == 0 { s += $7 } END { print s }'
}

# The sizes of those buffers' buckets (elements), one data-parallel reduction each, on a line.
bucket_sizes() {
    build/gen --lua bench/parallel_buckets.lua "$B/out/$1/shards.json" |
        awk '$1 == "bucket" { printf "%s%d", n++ ? " " : "", $4 } END { print "" }'
}

# Analytic collectives per step of rank 0's groups, f32, one line per (group, op, size):
# "group op calls payload-bytes element-bytes".
# Megatron's regions for this program (PP 1): per micro-batch of N = MBS*T tokens,
#   no SP: all-reduce N*C after the embedding, after each of the 2 row-parallel layers of a
#          layer and before each of the 2 column-parallel inputs in its backward, of the
#          head's input gradient, and for the loss the logits' max (N) and [sum exp | target
#          logit] (2N);
#   SP:    all-gather N*C before every column-parallel layer (2 per layer forward; in backward
#          2 of the row-parallel outputs' gradients and 2 re-gathers of the column-parallel
#          inputs for their weight gradients, docs/megatron.md §9.3), of the head's input and of
#          the embedding's gradient; reduce-scatter N*C after every
#          row-parallel layer (2 forward) and column-parallel input gradient (2 backward) and of
#          the head's input gradient; all-reduce N*C after the embedding and N, 2N for the loss;
#          once per step the gradients of the SP parameters, (6L + 2)*C;
# then per step: data-parallel all-reduce of each gradient bucket (reduce-scatter + all-gather
# with the distributed optimizer); the gradient norm (1 float, over mp = tp or, with DIST_OPT,
# the world) and [the loss | stop] (2 floats, world).
analytic() {
    local tp=$1 dp=$2 sp=$3 dop=$4 buckets=$5
    awk -v tp="$tp" -v dp="$dp" -v sp="$sp" -v dop="$dop" -v buckets="$buckets" -v L="$L" \
        -v C="$C" -v N="$((MBS_OF_DP * T))" -v M=1 'BEGIN {
        if (tp > 1) {
            if (sp) {
                printf "tp allgather %d %d 4\n", M * (6 * L + 2), 4 * N * C
                printf "tp reduce_scatter %d %d 4\n", M * (4 * L + 1), 4 * N * C
                printf "tp allreduce %d %d 4\n", M, 4 * N * C
                printf "tp allreduce 1 %d 4\n", 4 * (6 * L + 2) * C
            } else {
                printf "tp allreduce %d %d 4\n", M * (4 * L + 2), 4 * N * C
            }
            printf "tp allreduce %d %d 4\n", M, 4 * N           # the logits max
            printf "tp allreduce %d %d 4\n", M, 8 * N           # [sum exp | target logit]
            if (!dop) printf "tp allreduce 1 4 4\n"             # gradient norm over mp = tp
        }
        if (dp > 1) {
            nb = split(buckets, b, " ")
            for (i = 1; i <= nb; i++)
                if (dop) {
                    printf "dp reduce_scatter 1 %d 4\n", 4 * b[i]
                    printf "dp allgather 1 %d 4\n", 4 * b[i]
                } else {
                    printf "dp allreduce 1 %d 4\n", 4 * b[i]
                }
        }
        if (tp * dp > 1) {
            printf "world allreduce 1 8 4\n"                    # [the loss | stop]
            if (dop) printf "world allreduce 1 4 4\n"           # gradient norm
        }
    }'
}

# group label of a member list seen by rank 0 (PP 1, order tp-cp-ep-dp-pp)
label() {   # members tp dp
    local m=$1 tp=$2 dp=$3 w=$(($2 * $3)) tpg dpg wg i
    tpg=$(seq -s, 0 $((tp - 1)))
    dpg=$(seq -s, 0 "$tp" $(((dp - 1) * tp)))
    wg=$(seq -s, 0 $((w - 1)))
    local names=()
    [ "$m" = "$tpg" ] && [ "$tp" -gt 1 ] && names+=(tp)
    [ "$m" = "$dpg" ] && [ "$dp" -gt 1 ] && names+=(dp)
    [ "$m" = "$wg" ] && names+=(world)
    i="${names[*]}"
    echo "${i// /=}"
}

# per_step NAME STEPS: rank 0's "op communicator members bytes" per step, (STEPS-step run -
# 1-step run) / (STEPS - 1), from the shim's counts of the runs tagged k and z
per_step() {
    awk -v K="$(($2 - 1))" 'FNR == 1 { f++ } NF == 5 {
            key = $1 " " $2 " " $3; if (f == 1) z[key] += $5; else k[key] += $5; keys[key] = 1 }
        END { for (key in keys) printf "%s %.0f\n", key, (k[key] - z[key]) / K }' \
        "$B/$1.z.0" "$B/$1.k.0"
}

# measure MODEL_ARG NAME TP DP MBS SP DISTOPT STEPS: build, run, print one result row
measure() {
    local model=$1 name=$2 tp=$3 dp=$4 mbs=$5 sp=$6 dop=$7 steps=$8 w=$(($3 * $4))
    MBS_OF_DP=$mbs
    if ! build "$model" "$name" "$tp" "$dp" "$mbs" "$sp" "$dop"; then
        echo "$name: build failed: $(grep -m1 -E 'error' "$B/$name".*.log)"
        return
    fi
    rm -f "$B/$name".k.* "$B/$name".z.*
    run "$name" "$w" 1 z ||
        { echo "$name: run failed: $(grep -m1 -E 'error|rank' "$B/$name".z.log)"; return; }
    # tokens/s: the median over the steps after the first; the best of REPEAT runs (other
    # load on a shared machine only ever slows a run down)
    local toks=0 t hwm S
    for ((i = 0; i < REPEAT; i++)); do
        run "$name" "$w" "$steps" k ||
            { echo "$name: run failed: $(grep -m1 -E 'error|rank' "$B/$name".k.log)"; return; }
        t=$(awk -F'"tok_s":' 'NR > 1 { split($2, a, "}"); print a[1] }' "$B/$name.jsonl" |
            sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]
                                                 else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
        toks=$(awk -v a="$toks" -v b="$t" 'BEGIN { print (b > a) ? b : a }')
    done
    hwm=$(cat "$B/$name".k.* | awk '$1 == "hwm_kib" && $2 > m { m = $2 } END { print m }')
    peak=$(cat "$B/$name".k.* | awk '$1 == "rt_peak_bytes" && $2 > m { m = $2 } END { print m }')
    S=$(buffer_size "$name")
    printf "%-28s %5d %10.0f %11.1f %11.1f\n" "$name" "$w" "$toks" \
        "$(echo "$hwm" | awk '{ print $1 / 1024 }')" \
        "$(echo "$peak" | awk '{ print $1 / 1048576 }')" \
        >> "$B/throughput.txt"
    echo "$name $w $peak $S $tp $dp $sp $dop $hwm" >> "$B/memory.raw"
    # bytes per step of rank 0 by group: (K-step run - 1-step run) / (K - 1); the runtime's
    # p2p communicator apart (its members are the world's)
    {
        per_step "$name" "$steps" | while read -r op comm m bytes; do
                [ "$bytes" = 0 ] && continue
                n=$(echo "$m" | tr ',' '\n' | wc -l)
                g=$(label "$m" "$tp" "$dp")
                [ -z "$g" ] && g="{$m}"
                [ "$comm" = p2p ] && g=p2p
                echo "measured $g $op $bytes $n"
            done
        analytic "$tp" "$dp" "$sp" "$dop" "$(bucket_sizes "$name")" |
        while read -r g op calls bytes es; do
            local n=$tp
            [ "$g" = dp ] && n=$dp
            [ "$g" = world ] && n=$w
            # groups with the same members are one communicator set: merge their labels
            [ "$g" = tp ] && [ "$dp" = 1 ] && g="tp=world"
            [ "$g" = dp ] && [ "$tp" = 1 ] && g="dp=world"
            [ "$g" = world ] && [ "$dp" = 1 ] && g="tp=world"
            [ "$g" = world ] && [ "$tp" = 1 ] && g="dp=world"
            echo "analytic $g $op $calls $bytes $es $n"
        done
    } | awk -v name="$name" '
        # ring bytes per rank of one call of N bytes over p ranks
        function ring(op, N, p) { return op == "allreduce" ? 2 * N * (p - 1) / p : N * (p - 1) / p }
        # bytes group rank r sends for one call of N bytes of es-byte elements over p ranks, by
        # runtime/rt_mpi.c reduce_start and rt__h_allgather_start (the formulas in the header)
        function algo(op, N, es, p, r,    E, m, full, rem, s) {
            if (op != "allreduce") return N * (p - 1) / p
            if (N <= 4096) return N * (p - 1)
            E = N / es; m = int(1048576 / ((p - 1) * es))
            full = int(E / (m * p)); rem = E - full * m * p
            s = full * 2 * m * (p - 1)
            if (rem > 0) s += rem + (p - 2) * (int(rem * (r + 1) / p) - int(rem * r / p))
            return s * es
        }
        $1 == "measured" { g = $2; size[g] = $5; groups[g] = 1
            if ($3 == "send" || $3 == "send.bf16") sent[g] += $4
            else if ($3 == "recv" || $3 == "recv.bf16") recv[g] += $4
            else if ($3 !~ /^send@/) coll[g] += $4 }       # an MPI collective
        $1 == "analytic" { g = $2; size[g] = $7; groups[g] = 1; calls[g, $3] += $4
            pay[g] += $4 * $5; rg[g] += $4 * ring($3, $5, $7)
            al[g] += $4 * algo($3, $5, $6, $7, 0) }
        END { for (g in groups) {
                  ops = ""
                  if (calls[g, "allreduce"]) ops = ops " ar:" calls[g, "allreduce"]
                  if (calls[g, "reduce_scatter"]) ops = ops " rs:" calls[g, "reduce_scatter"]
                  if (calls[g, "allgather"]) ops = ops " ag:" calls[g, "allgather"]
                  note = recv[g] != sent[g] ? "  received != sent" : ""
                  if (coll[g]) note = note sprintf("  + MPI collectives: %.0f", coll[g])
                  printf "%-28s %-9s %5d %-16s %12.0f %12.0f %12.0f %12.0f %12.0f %7.4f%s\n",
                         name, g, size[g], (ops == "" ? "-" : substr(ops, 2)), pay[g], rg[g],
                         al[g], sent[g], recv[g], (al[g] > 0 ? sent[g] / al[g] : 0), note } }' |
        sort >> "$B/bytes.txt"
}

print_tables() {
    echo
    echo "== $1: tokens/s for a fixed global batch ($2), peak memory per rank (max over ranks:"
    echo "   VmHWM = resident set; rt_malloc = the runtime's allocations, i.e. the program's state)"
    printf "%-28s %5s %10s %11s %11s\n" layout world "tokens/s" "VmHWM MiB" "rt_malloc"
    cat "$B/throughput.txt"
    echo
    echo "== $1: bytes rank 0 moves per step, per group: its collectives' calls (ar all-reduce,"
    echo "   rs reduce-scatter, ag all-gather) and payload N from Megatron's regions, moved by a"
    echo "   ring and by the runtime's algorithm (analytic, see the header), against what it sent"
    echo "   and received on the group's communicator (MPI_Isend / MPI_Irecv, counted by the MPI"
    echo "   shim); ratio = sent / algorithm"
    printf "%-28s %-9s %5s %-16s %12s %12s %12s %12s %12s %7s\n" layout group ranks calls \
        "payload N" ring algorithm sent received ratio
    cat "$B/bytes.txt"
    echo
    echo "== $1: memory per rank with and without DIST_OPT (peak rt_malloc bytes, max over ranks;"
    echo "   S = gradient-buffer elements per rank; the fp32 row of docs/megatron.md §5.7"
    echo "   saves 16S - (8 + 8/d)S,"
    echo "   as the program's buffers do: f32 params + grads on S (gradients reduce-scattered in"
    echo "   place) and m + v on S/d. The runtime's reduction scratch (runtime/rt_mpi.c: per call"
    echo "   up to 4 slices in flight of d-1 blocks, pooled) is the same for a bucket's all-reduce"
    echo "   and its reduce-scatter (the same slices; not for buckets of 4 KiB or less, sent"
    echo "   whole), and the all-gather needs none, so saved = §5.7; rt_malloc rounds each"
    echo "   block up to 256 bytes, which a ratio off 1 by 1e-4 is)"
    printf "%-24s %2s %11s %10s %10s %10s %10s %7s\n" "layout" d S "off" "on" "saved" "§5.7" \
        ratio
    awk '{ peak[$1] = $3; S[$1] = $4; dp[$1] = $6; dop[$1] = $8; names[NR] = $1 }
        END { for (i = 1; i <= NR; i++) { n = names[i]; if (dop[n] != 1) continue
                  base = n; sub(/-distopt$/, "", base); if (!(base in peak)) continue
                  d = dp[n]; s = S[n]; M = 1048576; saved = peak[base] - peak[n]
                  want = (8 - 8 / d) * s
                  printf "%-24s %2d %11d %8.2f M %8.2f M %8.2f M %8.2f M %7.4f\n",
                         base, d, s, peak[base] / M, peak[n] / M, saved / M, want / M,
                         saved / want } }' "$B/memory.raw"
}

# -- tiny: 8 layers, hidden 64, T 64; global batch 16 sequences (1024 tokens), 20 steps ------

if [[ " $what " == *" tiny "* ]]; then
    : > "$B/throughput.txt"; : > "$B/bytes.txt"; : > "$B/memory.raw"
    build/ref/make_tokens --vocab 256 --tokens 200000 "$B/tiny.bin" > /dev/null
    DATA=$B/tiny.bin INIT_ARG="" SEQ_ARG="" L=8 C=64 T=64 REPEAT=${BENCH_REPEAT:-3}
    measure tiny tiny-w1 1 1 16 0 0 20
    measure tiny tiny-tp2 2 1 16 0 0 20
    measure tiny tiny-tp2-sp 2 1 16 1 0 20
    measure tiny tiny-dp2 1 2 8 0 0 20
    measure tiny tiny-dp2-distopt 1 2 8 0 1 20
    measure tiny tiny-tp4-sp 4 1 16 1 0 20
    measure tiny tiny-dp4 1 4 4 0 0 20
    measure tiny tiny-dp4-distopt 1 4 4 0 1 20
    measure tiny tiny-tp2-dp2-sp 2 2 8 1 0 20
    measure tiny tiny-tp2-dp2-sp-distopt 2 2 8 1 1 20
    print_tables tiny "16 x 64 tokens" | tee "$B/tiny.txt"
fi

# -- GPT-2 124M at sequence 64: global batch 8 sequences (512 tokens), 4 steps ------------------

if [[ " $what " == *" gpt2 "* ]]; then
    : > "$B/throughput.txt"; : > "$B/bytes.txt"; : > "$B/memory.raw"
    build/ref/make_tokens --vocab 50257 --tokens 20000 "$B/gpt2.bin" > /dev/null
    DATA=$B/gpt2.bin INIT_ARG="" SEQ_ARG="--seq 64" L=12 C=768 T=64 REPEAT=${BENCH_REPEAT:-1}
    measure gpt2_124m gpt2-w1 1 1 8 0 0 4
    measure gpt2_124m gpt2-tp2-sp 2 1 8 1 0 4
    measure gpt2_124m gpt2-dp2 1 2 4 0 0 4
    measure gpt2_124m gpt2-dp2-distopt 1 2 4 0 1 4
    measure gpt2_124m gpt2-tp4-sp 4 1 8 1 0 4
    measure gpt2_124m gpt2-dp4 1 4 2 0 0 4
    measure gpt2_124m gpt2-dp4-distopt 1 4 2 0 1 4
    measure gpt2_124m gpt2-tp2-dp2-sp 2 2 4 1 0 4
    measure gpt2_124m gpt2-tp2-dp2-sp-distopt 2 2 4 1 1 4
    print_tables "gpt2_124m (seq 64)" "8 x 64 tokens" | tee "$B/gpt2.txt"
fi

# -- bf16 against f32 (tiny): bytes sent per step by rank 0, per communicator -----------------
# Megatron's --bf16 moves activations, their gradients and (DIST_OPT) the updated parameters in
# bf16 and reduces the weight gradients in f32. The shim counts sends of 2-byte elements apart,
# so for each communicator the table gives the bytes rank 0 sends per step (MPI_Isend: on a
# group's communicator what the runtime's collectives move, on "p2p" the pipeline's messages)
# in the f32 run, and in the bf16 run those sent as f32 and as bf16; communicators with the same
# members are one row ({members}), the runtime's p2p communicator its own ("p2p"). "same
# elements" checks that the bf16 run sends the f32 run's elements (f32 = as f32 + 2 x as bf16,
# within 0.1 %: an all-reduce over more than 2 ranks may cut a buffer of 2-byte elements into
# other slices, or send it whole where f32 would not), so the ratio says what halving the
# activations saves: 0.5 where only activations travel (p2p), 0.75 for the data-parallel group
# with DIST_OPT (f32 gradients reduce-scattered, bf16 parameters gathered), 1.0 for gradient
# all-reduces and the loss (the PP 2 stages' pair: the tied embedding's gradient, the norm, the
# loss); the tensor-parallel group in between, as the loss's f32 all-reduces (the logits' max,
# [sum exp | target logit]) and with SP the SP parameters' f32 gradients travel beside the
# activations.

# traffic NAME WORLD STEPS: rank 0's "op communicator members bytes-per-step" in $B/NAME.traffic
traffic() {
    local name=$1 w=$2 steps=$3
    rm -f "$B/$name".k.* "$B/$name".z.*
    run "$name" "$w" 1 z && run "$name" "$w" "$steps" k ||
        { echo "$name: run failed: $(grep -m1 -E 'error|rank' "$B/$name".[zk].log)"; return 1; }
    per_step "$name" "$steps" | awk '$4 > 0' > "$B/$name.traffic"
}

# bf16_pair NAME TP DP MBS SP DISTOPT FLAGS...: both precisions, one table row per communicator
bf16_pair() {
    local name=$1 tp=$2 dp=$3 mbs=$4 sp=$5 dop=$6 w
    shift 6
    EXTRA="$*" build tiny "$name" "$tp" "$dp" "$mbs" "$sp" "$dop" &&
        EXTRA="$* --bf16" build tiny "$name-bf16" "$tp" "$dp" "$mbs" "$sp" "$dop" ||
        { echo "$name: build failed: $(grep -m1 error "$B/$name"*.log)"; return; }
    w=$(sed -n 's/.*"world": *\([0-9]*\).*/\1/p' "$B/out/$name/topology.json" | head -1)
    traffic "$name" "$w" 6 && traffic "$name-bf16" "$w" 6 || return
    cat "$B/$name.traffic" - "$B/$name-bf16.traffic" <<< "--" | awk -v name="$name" '
        $1 == "--" { run = 2; next }
        $1 != "send" && $1 != "send.bf16" { next }      # receives (the same), tags, MPI calls
        { k = $2 == "p2p" ? "p2p" : "{" $3 "}"; g[k] = 1
          if (run != 2) f[k] += $4; else if ($1 == "send.bf16") b16[k] += $4; else b32[k] += $4 }
        END { for (k in g) {
                  t = b32[k] + b16[k]; e = b32[k] + 2 * b16[k]
                  printf "%-20s %-10s %12.0f %12.0f %12.0f %12.0f %6.3f  %s\n", name, k,
                         f[k], b32[k], b16[k], t, f[k] ? t / f[k] : 0,
                         (e >= f[k] && e <= f[k] * 1.001) ? "yes" : "NO" } }' | sort
}

if [[ " $what " == *" bf16 "* ]]; then
    [ -f "$B/tiny.bin" ] || build/ref/make_tokens --vocab 256 --tokens 200000 "$B/tiny.bin" > /dev/null
    DATA=$B/tiny.bin INIT_ARG="" SEQ_ARG=""
    {
        echo
        echo "== tiny: bytes sent per step by rank 0, per communicator (its members; p2p: the"
        echo "   runtime's point-to-point one), f32 run against the --bf16 run (6 steps minus 1)"
        printf "%-20s %-10s %12s %12s %12s %12s %6s  %s\n" layout group "f32 run" "bf16: as f32" \
            "as bf16" total ratio "same elements"
        bf16_pair tiny-tp2 2 1 16 0 0
        bf16_pair tiny-tp2-sp 2 1 16 1 0
        bf16_pair tiny-tp4-sp 4 1 16 1 0
        bf16_pair tiny-pp2 1 1 4 0 0 --pp 2 --nmb 4
        bf16_pair tiny-dp2-distopt 1 2 8 0 1
        bf16_pair tiny-tp2-pp2-sp 2 1 4 1 0 --pp 2 --nmb 4
    } | tee "$B/bf16.txt"
fi
