#!/bin/bash
# tests/parallel/suite.sh: tensor, sequence and data parallelism and the distributed optimizer
# train the same model as one rank. The runs and their references are data:
# tests/parallel/layouts.txt (every layout against the single-rank program, checkpoints that
# continue across layouts, a control that must fail) and tests/parallel/gpu.txt (CUDA), read by
# tests/lib.sh's equivalence runner. Here: the inputs, the checks that are not comparisons of
# two runs (every layout loads and saves a checkpoint bit for bit; shards.json shows the
# straddling parameters and the indivisible counts). Tolerances: tests/parallel/README.md.
. "$(dirname "$0")/../lib.sh" parallel

if ! make -s --no-print-directory build/gen build/librt_cpu.a ref build/tools/stcompare \
        > "$S/make.log" 2>&1; then
    fail setup "make build/gen librt_cpu.a ref stcompare failed: $(tail -n 1 "$S/make.log")"
    finish
fi
REF=build/ref/gpt2_ref
# tiny (models/tiny.lua) and odd (tests/models/odd.lua): one init each, one token file each
$REF --layers 8 --hidden 64 --heads 4 --seq 64 --vocab 256 --random-init 7 \
     --save-init "$S/tiny.init.safetensors" > "$S/ref.log" 2>&1 &&
$REF --layers 2 --hidden 35 --heads 5 --seq 30 --vocab 97 --random-init 11 \
     --save-init "$S/odd.init.safetensors" >> "$S/ref.log" 2>&1 &&
build/ref/make_tokens --vocab 256 --tokens 20000 --seed 3 "$S/tiny.bin" >> "$S/ref.log" 2>&1 &&
build/ref/make_tokens --vocab 97 --tokens 20000 --seed 5 "$S/odd.bin" >> "$S/ref.log" 2>&1 || {
    fail setup "cannot make the init or token files: $(tail -n 1 "$S/ref.log")"
    finish
}

equiv tests/parallel/layouts.txt

# Training changes the weights (or the comparisons above compare inits).
if $STCOMPARE -q --exact "$S/tiny.init.safetensors" "$S/run/tiny-tp1-dp1.safetensors" \
        > /dev/null 2>&1; then
    fail control-trained "training did not change the weights"
else
    pass control-trained
fi

# -- Checkpoints are layout-free -------------------------------------------------------------------

# Every layout of the matrix loads the single-rank run's trained weights (biases and LayerNorms
# no longer 0 and 1) and --save's them back unchanged, bit for bit (--steps 0: no training).
# rt_one NAME SRC: $S/run/NAME.rt.ok when NAME loads SRC's weights and saves them unchanged
rt_one() {
    tokens_take
    if run_prog "${DIR[$1]}/train" "${WORLD[$1]}" "$S/run/$1.rt.log" --quiet \
            --init "$S/run/$2.safetensors" --steps 0 --save "$S/run/$1.rt.safetensors" &&
       $STCOMPARE -q --exact "$S/run/$1.rt.safetensors" "$S/run/$2.safetensors" \
            > "$S/run/$1.rt.cmp" 2>&1; then
        touch "$S/run/$1.rt.ok"
    fi
    tokens_give
}
rt_bad=""
rt_n=0
declare -A rt_src
pool_start "${TEST_ROW_JOBS:-2}"       # side by side, as equiv's rows
for name in "${!DIR[@]}"; do
    case $name in tiny-*) src=tiny-tp1-dp1 ;; odd-*) src=odd-tp1-dp1 ;; *) continue ;; esac
    [ -f "$S/run/$src.safetensors" ] || continue
    rt_n=$((rt_n + 1))
    rt_src[$name]=$src
    pool_add rt_one "$name" "$src"
done
pool_wait
for name in "${!rt_src[@]}"; do
    [ -f "$S/run/$name.rt.ok" ] || rt_bad="$rt_bad $name"
done
if [ $rt_n -lt 30 ]; then
    fail checkpoint-roundtrip "only $rt_n layouts could be checked"
elif [ -n "$rt_bad" ]; then
    fail checkpoint-roundtrip "load + save is not the identity for:$rt_bad"
else
    pass checkpoint-roundtrip
fi

# -- The layouts test what they claim (from shards.json) -------------------------------------------

shards_of() { build/gen --lua tests/parallel/shards_check.lua "${DIR[$1]}/shards.json"; }
# A parameter straddles a distributed-optimizer shard boundary in the DP 2, DP 4 and DP 3 runs.
for name in tiny-tp2-dp2-sp-distopt tiny-tp1-dp4-distopt odd-tp1-dp3-distopt; do
    [ -n "${DIR[$name]}" ] || continue
    st=$(shards_of "$name" | grep -m1 '^straddle')
    if [ -n "$st" ]; then pass "straddle-$name"
    else fail "straddle-$name" "no parameter crosses a shard boundary (shards.json)"; fi
done
# The odd model's gradient buffer holds a count that DP 2 and DP 3 do not divide.
for name in odd-tp1-dp2-distopt odd-tp1-dp3-distopt; do
    [ -n "${DIR[$name]}" ] || continue
    line=$(shards_of "$name" | grep -m1 '^buffer')
    set -- $line
    if [ "$#" -ge 9 ] && [ $(($5 % $9)) != 0 ]; then pass "indivisible-$name"
    else fail "indivisible-$name" "expected a count not divisible by DP, got: $line"; fi
done

# -- CUDA: the same programs compile and link; on a GPU they train like one GPU rank ------------

equiv tests/parallel/gpu.txt --cuda
# ... and the same table on the CPU emulation of CUDA (train_cuda_emu_mpi): every machine
equiv tests/parallel/gpu.txt --emu
finish
