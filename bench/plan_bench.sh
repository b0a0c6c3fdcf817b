#!/bin/bash
# bench/plan_bench.sh: the planner's CPU mode (gen --plan GPU=cpu, gen/lua/plan.lua) against
# measured steps (never part of make test). First the rates it is calibrated with, measured
# here on one core: oneDNN's f32 matmul (bench/sgemm_peak.c, SIZE^3, the library the CPU
# runtime calls) and the library's own element-wise kernels (bench/elem_rate.c: LayerNorm,
# GELU, the residual add, f32, in bytes moved per second), and the ranks' transport on 2 ranks
# (bench/runtime_bench.c transport: rt_allreduce's bus bandwidth). Each layout below is
# generated and built; then ROUNDS rounds each measure the rates and train every layout for
# STEPS steps (one thread per rank: RT_THREADS=1; ranks share the cores), so that a machine
# whose speed drifts (other tenants) moves rates and layouts alike. A layout's step time is the
# median over the rounds of each round's median step after WARMUP (the spread: the rounds'
# min-max); the prediction (bench/plan_predict.lua) uses the rates' medians over the rounds;
# the ratio is measured / predicted. At the end: whether the predicted order of the layouts is
# the measured one (Kendall's pairs).
#
#   bench/plan_bench.sh [LAYOUT...]        (default: all)
#   ROUNDS=3 STEPS=8 WARMUP=3 SIZE=512 RATES=GFLOPS,GBS[,GBS] (given: none measured)
#
# The machine may be shared: each round's median is kept, and the spread says how much the
# rounds disagreed.
cd "$(dirname "$0")/.." || exit 2
B=build/bench/plan
mkdir -p $B
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-8}
WARMUP=${WARMUP:-3}
SIZE=${SIZE:-512}
CORES=$(nproc)
export RT_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
. tests/mpi.sh
MPIRUN="mpirun --oversubscribe $TEST_MCA"
[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"

# name | model | generator flags
LAYOUTS="
tiny-1|tiny|--mbs 8 --nmb 2
tiny-rcfull|tiny|--mbs 8 --nmb 2 --recompute full --recompute-method uniform --recompute-layers 1
tiny-tp2|tiny|--tp 2 --mbs 8 --nmb 2
tiny-tp2sp|tiny|--tp 2 --sp --mbs 8 --nmb 2
tiny-dp2|tiny|--dp 2 --mbs 8 --nmb 1
tiny-pp2|tiny|--pp 2 --mbs 4 --nmb 4
tiny-tp2dp2|tiny|--tp 2 --dp 2 --mbs 8 --nmb 1
tiny-pp4|tiny|--pp 4 --mbs 4 --nmb 4
gpt2-1|gpt2_124m|--seq 128 --mbs 2 --nmb 1
gpt2-rcsel|gpt2_124m|--seq 128 --mbs 2 --nmb 1 --recompute selective
gpt2-tp2|gpt2_124m|--tp 2 --seq 128 --mbs 2 --nmb 1
gpt2-dp2|gpt2_124m|--dp 2 --seq 128 --mbs 1 --nmb 1
gpt2-pp2|gpt2_124m|--pp 2 --seq 128 --mbs 1 --nmb 2
gpt2-tp2dp2|gpt2_124m|--tp 2 --dp 2 --sp --seq 128 --mbs 1 --nmb 1
"
want=" $* "

if ! make -s --no-print-directory -j2 build/gen all > $B/make.log 2>&1; then
    echo "plan_bench: make failed: $(grep -m1 -i error $B/make.log)"; exit 1
fi

# -- Build ------------------------------------------------------------------------------------------
if [ -z "$RATES" ]; then
    gcc -std=c11 -O2 -Wall -Wextra -Werror $(pkg-config --cflags openblas) -o $B/sgemm_peak \
        bench/sgemm_peak.c $(pkg-config --libs openblas) -ldnnl -lgomp || exit 1
    mpicc -std=c11 -O2 -Wall -Wextra -Werror -Iruntime -Ilib -o $B/elem_rate bench/elem_rate.c \
        -Lbuild -lgpt_cpu -lxxhash -lrt_cpu $(pkg-config --libs openblas) -ldnnl -lgomp \
        -lpthread -lm || exit 1
    make -s --no-print-directory build/bench/runtime_bench > /dev/null || exit 1
fi
DATA=$B/tok.bin
if [ ! -s $DATA ]; then
    if [ -x build/ref/make_tokens ]; then build/ref/make_tokens --vocab 256 --tokens 400000 $DATA \
        > /dev/null || exit 1
    else make -s data > /dev/null && cp data/corpus.bin $DATA || exit 1; fi
fi
median() { sort -n | awk '{a[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

names=()
declare -A MODEL FLAGS WORLD MEDS
while IFS='|' read -r name model flags; do
    [ -z "$name" ] && continue
    [ "$want" != "  " ] && [ "${want/ $name /}" = "$want" ] && continue
    dir=$B/$name
    # shellcheck disable=SC2086 # flags: words
    if [ ! -x $dir/train ]; then
        rm -rf $dir
        if ! build/gen $model $flags --out $dir > $dir.gen.log 2>&1 ||
           ! make -s --no-print-directory -j2 GEN_DIR=$dir GEN_OBJ=$dir.obj $dir/train \
               > $dir.build.log 2>&1; then
            echo "$name: build failed (see $dir.build.log)"; continue
        fi
    fi
    names+=("$name")
    MODEL[$name]=$model FLAGS[$name]=$flags
    WORLD[$name]=$(sed -n 's/^{"model": "[^"]*", "world": \([0-9]*\),.*/\1/p' $dir/topology.json)
done <<< "$LAYOUTS"

# -- Rounds: the rates, then every layout once ------------------------------------------------------
gs="" cs="" ts=""
for ((r = 0; r < ROUNDS; r++)); do
    if [ -z "$RATES" ]; then
        g=$(taskset -c 0 $B/sgemm_peak "$SIZE" 9 1 | awk '$1 == "peak_dnnl_f32" {print $3}')
        c=$(taskset -c 0 $B/elem_rate 2048 768 9 | awk '{print $2}')
        t=$($MPIRUN -np 2 build/bench/runtime_bench transport 30M < /dev/null |
            awk '$1 == "transport" {print $2}')
        gs="$gs $g" cs="$cs $c" ts="$ts $t"
    fi
    for name in "${names[@]}"; do
        dir=$B/$name log=$B/$name.run$r.log
        if [ "${WORLD[$name]}" = 1 ]; then
            timeout 600 $dir/train --data $DATA --steps "$STEPS" > $log 2>&1 < /dev/null
        else
            timeout 600 $MPIRUN -np "${WORLD[$name]}" $dir/train --data $DATA --steps "$STEPS" \
                > $log 2>&1 < /dev/null
        fi
        m=$(grep '^step' $log | awk -v w="$WARMUP" -F'|' 'NR > w {for (i = 1; i <= NF; i++)
            if ($i ~ / ms *$/) {sub(/ ms */, "", $i); print $i + 0}}' | median)
        MEDS[$name]="${MEDS[$name]} $m"
    done
done
range() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR] = $1} END {printf "%s-%s", a[1], a[NR]}'; }
if [ -z "$RATES" ]; then
    g=$(echo $gs | tr ' ' '\n' | median) c=$(echo $cs | tr ' ' '\n' | median)
    t=$(echo $ts | tr ' ' '\n' | median)
    echo "rates, the median (range) of $ROUNDS rounds: oneDNN f32 matmul ${SIZE}^3 on one core" \
         "$g GFLOP/s ($(echo $gs | range)); the library's LayerNorm, GELU and add kernels $c GB/s" \
         "($(echo $cs | range)); rt_allreduce of 120 MB on 2 ranks $t GB/s bus bandwidth" \
         "($(echo $ts | range))"
    RATES="$g,$c,$t"
fi
echo "planner: --cpu-rates $RATES --cores $CORES (ranks share the $CORES cores)"

printf "%-13s %5s %10s %10s %15s %7s\n" layout ranks predicted measured "spread (rounds)" ratio
: > $B/rows
for name in "${names[@]}"; do
    # shellcheck disable=SC2086
    pred=$(build/gen --lua bench/plan_predict.lua "$RATES" "$CORES" ${MODEL[$name]} \
           ${FLAGS[$name]} | awk '{print $2}')
    meds=${MEDS[$name]}
    med=$(echo $meds | tr ' ' '\n' | median)
    lo=$(echo $meds | tr ' ' '\n' | sort -n | head -1)
    hi=$(echo $meds | tr ' ' '\n' | sort -n | tail -1)
    ratio=$(awk -v a="$med" -v b="$pred" 'BEGIN {printf "%.2f", a / b}')
    printf "%-13s %5s %8.1f ms %7.1f ms %7.1f-%-7.1f %7s\n" "$name" "${WORLD[$name]}" "$pred" \
        "$med" "$lo" "$hi" "$ratio"
    echo "$name $pred $med $lo $hi" >> $B/rows
done

# -- Order: the pairs the prediction orders as measured -------------------------------------------
# A pair whose rounds' spreads overlap is one the measurement itself does not order (two runs
# of one layout differ as much): it is counted apart.
awk '{n[NR] = $1; p[NR] = $2; m[NR] = $3; lo[NR] = $4; hi[NR] = $5}
     END {good = 0; all = 0; sep = 0; sgood = 0; worst = 0
          for (i = 1; i <= NR; i++) {
              r = m[i] / p[i]; d = r > 1 ? r - 1 : 1 - r; if (d > worst) worst = d
              for (j = i + 1; j <= NR; j++) {
                  all++
                  s = hi[i] < lo[j] || hi[j] < lo[i]
                  sep += s
                  if ((p[i] - p[j]) * (m[i] - m[j]) > 0) { good++; sgood += s }
                  else printf "order: %s and %s swap (predicted %.1f, %.1f; measured %.1f, %.1f%s)\n", n[i], n[j], p[i], p[j], m[i], m[j], s ? "" : ": within the spread of the rounds"
              }}
          printf "order: %d of %d pairs as measured; of the %d pairs the rounds separate, %d; worst ratio off by %.0f %%\n", good, all, sep, sgood, 100 * worst}' $B/rows
