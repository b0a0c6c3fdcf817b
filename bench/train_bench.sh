#!/bin/sh
# bench/train_bench.sh: our generated CPU training program against PyTorch (eager, CPU) on the
# same model and batch, fp32 and bf16, in one run (never part of make test). Per model, thread
# count and precision it prints ms/step and tokens/s of both and their ratio, and our step's
# GFLOP/s (model FLOPs, below) against three GEMM peaks measured in the same run at the same
# thread count (bench/sgemm_peak.c, 2048^3): OpenBLAS sgemm, oneDNN f32 matmul and oneDNN bf16
# matmul; then, per model and precision, where our step goes (bench/step_profile.c).
#
#   bench/train_bench.sh [tiny] [gpt2-t64] [gpt2-t256]     (default: all three)
#   THREADS="1 2"  PREC="f32 bf16"  STEPS=N (timed steps, default per model)
#   WARMUP=N (default 2 or 5)  NO_TORCH=1 (ours only)  NO_PROFILE=1 (no breakdown)
#   QUIET_WAIT=S (see settle, 120)  ROUNDS=N (rounds of ours then PyTorch per row; default 3
#   for tiny, 1 for gpt2)
#
# Models: tiny (models/tiny.lua: 8 layers, hidden 64, T 64, vocab 256) at 8 sequences, and
# models/gpt2_124m.lua (12 layers, hidden 768, 12 heads, vocabulary padded to 50304) at 4
# sequences of 64 and of 256 tokens. One rank (tp1 pp1 dp1); threads pinned with taskset to
# cores 0..t-1. bf16: our program built with --bf16 (Megatron's mixed precision: bf16 weights
# and activations, fp32 main weights, gradients and AdamW); PyTorch's forward under
# torch.autocast("cpu", bfloat16) (bf16 matmuls, fp32 parameters, gradients and AdamW).
# PyTorch gets OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = MKL_NUM_THREADS = t,
# torch.set_num_threads(t) and OMP_WAIT_POLICY=PASSIVE: its two pools otherwise spin against
# each other ("threading trap"; measured here at 2 threads, 4 layers: gpt2-t64 1377 ms without
# PASSIVE, 1142 with, 1580 with OpenBLAS held to 1 thread; tiny 105, 51, 45 ms).
# Model FLOPs per step: 3 x forward (backward = 2 x forward), forward = GEMMs 2 N (12 L C^2 + C V)
# with N = B T tokens, plus causal attention 2 B T^2 C per layer (q k^T and p v over the lower
# triangle; PyTorch computes the full T x T block, twice that, and is given the same count).
# Timing: the first WARMUP steps are dropped; the median of the rest is reported with its
# min-max spread (with several rounds: the round with the lowest median, for each side).
# Before each run the script waits for other processes to leave the CPUs (settle); rows
# measured while they did not are marked. On the shared 2-core VM quiet 2-thread medians
# still vary by up to ~40 % between rounds (tiny: 12.7 or 17.3 ms); with other jobs running
# they mean nothing (a spinning pool waits for a descheduled thread).
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-1 2}
PREC=${PREC:-f32 bf16}
B=build/bench/train
mkdir -p $B
what=${*:-tiny gpt2-t64 gpt2-t256}
for w in $what; do
    case $w in tiny|gpt2-t64|gpt2-t256) ;;
    *) echo "usage: bench/train_bench.sh [tiny] [gpt2-t64] [gpt2-t256]" >&2; exit 2 ;;
    esac
done
for p in $PREC; do
    case $p in f32|bf16) ;;
    *) echo "train_bench: PREC: f32 or bf16, not '$p'" >&2; exit 2 ;;
    esac
done

# -- PyTorch: Debian's python3-torch, installed here (never by the tests) --------------------
have_torch=0
if [ -z "$NO_TORCH" ]; then
    if ! $PY -c 'import torch' 2>/dev/null; then
        echo "train_bench: installing python3-torch (apt-get)"
        SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
        $SUDO apt-get install -y -q python3-torch > $B/apt.log 2>&1 ||
            { $SUDO apt-get update -q >> $B/apt.log 2>&1 &&
              $SUDO apt-get install -y -q python3-torch >> $B/apt.log 2>&1; }
    fi
    if $PY -c 'import torch' 2>/dev/null; then have_torch=1
    else echo "train_bench: no PyTorch for $PY (see $B/apt.log): our side only"; fi
fi

# -- Build: generator, runtime, corpus, the programs, the profiler, the peak probe ------------
make -s --no-print-directory build/gen build/librt_cpu.a data/corpus.bin || exit 1
BLAS_CFLAGS=$(pkg-config --cflags openblas) BLAS_LIBS=$(pkg-config --libs openblas)
DNNL_LIBS="-ldnnl -lgomp"
# what a generated CPU program links (lib/lib.mk), from the Makefile itself
GPT_CPU_LIBS=$(make -s --no-print-directory -f Makefile \
               -f <(printf 'pv:\n\t@echo $(GPT_CPU_LIBS)\n') pv) || exit 1
gcc -std=c11 -O2 -Wall -Wextra -Werror $BLAS_CFLAGS -o $B/sgemm_peak bench/sgemm_peak.c \
    $BLAS_LIBS $DNNL_LIBS || exit 1
WRAP="embed_fwd embed_bwd pos_fwd pos_bwd layernorm_fwd add_layernorm_fwd layernorm_bwd
      gelu_fwd gelu_bwd bias_fwd bias_bwd add_fwd add_inplace attention_fwd attention_bwd
      ce_rowmax ce_sums ce_loss ce_bwd ce_fused sum_rows adamw_step adamw_multi sumsq
      sumsq_multi scale_inplace rt_gemm rt_gemm_epi rt_memset0"

# build MODEL GENFLAGS...: generate, build out/<dir>/train and train_prof; sets $dir
build() {
    model=$1; shift
    dir=$(build/gen --print-out "$model" "$@") || exit 1
    build/gen "$model" "$@" > /dev/null || exit 1
    rm -rf "build/$dir"          # flags (GEN_OPT) may have changed since the last build
    make -s --no-print-directory GEN_DIR="$dir" "$dir/train" || exit 1
    [ -n "$NO_PROFILE" ] && return
    obj=build/$dir wraps=
    for s in $WRAP; do wraps="$wraps -Wl,--wrap=$s"; done
    mpicc -std=c11 -O2 -Wall -Wextra -Werror -Iruntime -Ilib -c -o "$obj/step_profile.o" \
        bench/step_profile.c || exit 1
    objs=$(sed -n 's/^GEN_SRCS *:= *//p' "$dir/build.mk" | tr ' ' '\n' |
           sed "/^$/d; s|^|$obj/|; s|\.c$|.o|")
    # the library's calls into its kernels are wrapped too (they cross archive members)
    # shellcheck disable=SC2086
    mpicc -o "$dir/train_prof" $objs "$obj/step_profile.o" $wraps $GPT_CPU_LIBS || exit 1
}

# stats: "median min max" of the numbers on stdin, one a line
stats() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) { print "nan nan nan"; exit }
        m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.2f %.2f %.2f\n", m, v[1], v[NR] }'
}

# keep_best NAME MEDIAN MIN MAX: NAME_med/_min/_max := this round's if its median is lower
keep_best() {
    eval "cur=\$${1}_med"
    if [ -z "$cur" ] || awk -v a="$2" -v b="$cur" 'BEGIN { exit !(a < b) }'; then
        eval "${1}_med=$2 ${1}_min=$3 ${1}_max=$4"
    fi
}

cores() { echo "0-$(($1 - 1))"; }

# settle: wait (at most QUIET_WAIT seconds, default 120) until other processes use at most
# 10 % of the machine over 2 s; sets $busy to what was seen last (a row measured while the
# machine was busy is marked '*')
settle() {
    t0=$(date +%s)
    while :; do
        set -- $(head -1 /proc/stat); u1=$(($2 + $3 + $4 + $7 + $8)) a1=$(($u1 + $5 + $6))
        sleep 2
        set -- $(head -1 /proc/stat); u2=$(($2 + $3 + $4 + $7 + $8)) a2=$(($u2 + $5 + $6))
        busy=$((100 * (u2 - u1) / (a2 - a1 + 1)))
        [ $busy -le 10 ] || [ $(($(date +%s) - t0)) -ge "${QUIET_WAIT:-120}" ] && return
    done
}

# -- Peaks: measured before the runs and again after them (a busy neighbour on a shared VM can
# halve a 2-thread measurement); a peak is the best of all 14 repetitions ----------------------
echo "train_bench: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')," \
     "load $(cut -d' ' -f1-3 /proc/loadavg)"
measure_peaks() {
    for t in $THREADS; do
        settle
        OMP_WAIT_POLICY=PASSIVE taskset -c "$(cores "$t")" $B/sgemm_peak 2048 7 "$t"
    done >> $B/peak.txt
}
: > $B/peak.txt
measure_peaks
# peak_of NAME THREADS: GFLOP/s (NAME: peak = OpenBLAS sgemm, peak_dnnl_f32, peak_dnnl_bf16)
peak_of() { awk -v n="$1" -v t="$2" '$1 == n && $2 == t && $5 > m { m = $5 } END { print m }' \
                $B/peak.txt; }

# -- Runs: one line per row in rows.txt (model T B threads prec flops, ours' and PyTorch's
# median min max ms); the table is made at the end, when the peaks are known -----------------
: > $B/rounds.txt
: > $B/rows.txt
profiles=
for w in $what; do
    case $w in
    tiny)      model=tiny;                       L=8 C=64  H=4  V=256   T=64  NB=8 steps=30 ;;
    gpt2-t64)  model=gpt2_124m; L=12 C=768 H=12 V=50304 T=64  NB=4 steps=6 ;;
    gpt2-t256) model=gpt2_124m; L=12 C=768 H=12 V=50304 T=256 NB=4 steps=4 ;;
    esac
    steps=${STEPS:-$steps}
    warm=${WARMUP:-$([ "$w" = tiny ] && echo 5 || echo 2)}
    for p in $PREC; do
        build "$model" --mbs $NB --seq $T $([ $p = bf16 ] && echo --bf16)
        eval "dir_$p=\$dir"
    done
    # model FLOPs per step (header)
    flops=$(awk -v L=$L -v C=$C -v V=$V -v T=$T -v B=$NB 'BEGIN {
        N = B * T; printf "%.6g", 3 * (2 * N * (12 * L * C * C + C * V) + L * 2 * B * T * T * C) }')
    rounds=${ROUNDS:-$([ "$w" = tiny ] && echo 3 || echo 1)}
    for t in $THREADS; do
    for p in $PREC; do
        eval "dir=\$dir_$p"
        tflag=; [ $p = bf16 ] && tflag=--bf16
        ours_med= torch_med= torch_min=nan torch_max=nan seen= busiest=0 r=0
        while [ $r -lt "$rounds" ]; do
            r=$((r + 1))
            log=$B/$w-t$t-$p-r$r.jsonl
            settle
            [ $busy -gt $busiest ] && busiest=$busy
            RT_THREADS=$t taskset -c "$(cores "$t")" "$dir/train" --data data/corpus.bin \
                --steps $((warm + steps)) --quiet --log "$log" || exit 1
            set -- $(sed -n 's/.*"ms":\([0-9.]*\).*/\1/p' "$log" | tail -n +$((warm + 1)) | stats)
            keep_best ours "$@"
            seen="$seen ours $1"
            [ $have_torch = 1 ] || continue
            settle
            [ $busy -gt $busiest ] && busiest=$busy
            json=$B/$w-t$t-$p-r$r.torch.json
            OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t MKL_NUM_THREADS=$t \
                OMP_WAIT_POLICY=PASSIVE taskset -c "$(cores "$t")" $PY bench/torch_gpt.py \
                --layers $L --hidden $C --heads $H --vocab $V --seq $T --batch $NB \
                --threads $t --steps $steps --warmup "$warm" $tflag > "$json" || exit 1
            set -- $(sed -n 's/.*"ms": \[\([^]]*\)\].*/\1/p' "$json" | tr ', ' '\n\n' |
                     sed '/^$/d' | stats)
            keep_best torch "$@"
            seen="$seen torch $1"
        done
        [ "$rounds" -gt 1 ] && echo "$w t$t $p round medians (ms):$seen" >> $B/rounds.txt
        ours=$ours_med omin=$ours_min omax=$ours_max
        tms=${torch_med:-nan} tmin=$torch_min tmax=$torch_max
        mark=; [ $busiest -gt 10 ] && mark='*'
        echo "$w$mark $T $NB $t $p $flops $ours $omin $omax $tms $tmin $tmax" >> $B/rows.txt
        echo "$w$mark T=$T B=$NB threads=$t $p: ours $ours ms, PyTorch $tms ms"
    done
    done
    if [ -z "$NO_PROFILE" ]; then
        t=$(echo $THREADS | awk '{ print $NF }')
        for p in $PREC; do
            eval "dir=\$dir_$p"
            settle
            RT_THREADS=$t taskset -c "$(cores "$t")" "$dir/train_prof" --data data/corpus.bin \
                --steps $((warm + steps)) --quiet 2> $B/$w-$p-profile.txt > /dev/null || exit 1
            profiles="$profiles $w:$t:$p"
        done
    fi
done
measure_peaks
echo
for t in $THREADS; do
    for n in peak peak_dnnl_f32 peak_dnnl_bf16; do
        case $n in peak) what="OpenBLAS sgemm" ;; peak_dnnl_f32) what="oneDNN f32" ;;
                   *) what="oneDNN bf16" ;; esac
        awk -v n=$n -v t=$t -v what="$what" -v best="$(peak_of $n $t)" '$1 == n && $2 == t {
            med = med " " $3 } END { printf "%-14s 2048^3, %d thread(s): peak %s GFLOP/s " \
            "(medians of 7, before and after the runs:%s)\n", what, t, best, med }' $B/peak.txt
    done
done
echo
printf '%-10s %4s %3s %3s %4s | %9s %9s %13s | %9s %9s %13s | %6s | %7s %6s %6s\n' \
    model T B thr prec "ours ms" "ours tok/s" "(min-max ms)" "torch ms" "torch tok/s" \
    "(min-max ms)" ratio "GFLOP/s" "%oblas" "%dnnl" > $B/table.txt
while read -r w T NB t p f o omin omax tms tmin tmax; do
    awk -v w=$w -v T=$T -v B=$NB -v t=$t -v prec=$p -v o=$o -v omin=$omin -v omax=$omax \
        -v p=$tms -v pmin=$tmin -v pmax=$tmax -v f=$f \
        -v peak="$(peak_of peak $t)" -v dpeak="$(peak_of peak_dnnl_$p $t)" 'BEGIN {
        tok = B * T
        printf "%-10s %4d %3d %3d %4s | %9.1f %9.0f %13s | ", w, T, B, t, prec, o,
               tok / o * 1e3, sprintf("(%.0f-%.0f)", omin, omax)
        if (p == "nan") printf "%9s %9s %13s | %6s | ", "-", "-", "", "-"
        else printf "%9.1f %9.0f %13s | %5.2fx | ", p, tok / p * 1e3,
                    sprintf("(%.0f-%.0f)", pmin, pmax), p / o
        g = f / o * 1e-6
        printf "%7.1f %5.0f%% %5.0f%%\n", g, 100 * g / peak, 100 * g / dpeak }' >> $B/table.txt
done < $B/rows.txt
echo "ratio = torch ms / ours ms (above 1: we are faster). GFLOP/s: model FLOPs of a step"
echo "(GEMMs + causal attention) / our median time; %oblas: of OpenBLAS's 2048^3 sgemm, %dnnl: of"
echo "oneDNN's 2048^3 matmul in the row's precision, both at the row's threads (peaks above)."
echo "A '*' after the model: other processes kept the CPUs busy (> 10 %) for QUIET_WAIT s before"
echo "that row's runs; its times are not to be trusted. With ROUNDS > 1 (tiny: 3) each side's"
echo "best round median is shown (min-max: the steps of that round); all round medians follow."
cat $B/table.txt
[ -s $B/rounds.txt ] && sed 's/^/  /' $B/rounds.txt

# -- Where our step goes ------------------------------------------------------------------------
for x in $profiles; do
    w=${x%%:*} t=${x#*:} p=${x##*:} t=${t%:*}
    echo
    echo "$w, $t thread(s), $p, our step by kernel family (ms/step, wall clock, warm-up dropped):"
    sed -n 's/^profile: //p' $B/$w-$p-profile.txt |
        awk 'NR == 1 { print "  " $0; next } { printf "  %-14s %9.2f %5.1f%%\n", $1, $2, $3 }'
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
