#!/bin/bash
# tests/cp/suite.sh: context parallelism (docs/megatron.md §12) trains the same model as one
# rank. The runs and their references are data: tests/cp/layouts.txt (CP 2 and 4 with TP/SP,
# PP with VP, DP with the distributed optimizer, EP, bf16, recompute; both CP_COMM kinds),
# read by tests/lib.sh's equivalence runner, and tests/cp/gpu.txt (CUDA). Here: the inputs,
# and the checks that are not comparisons of two runs (the ring traffic of a run, traced, is
# what the generator declared: tests/program checks every op of the trace).
. "$(dirname "$0")/../lib.sh" cp

if ! make -s --no-print-directory build/gen build/librt_cpu.a ref build/tools/stcompare \
        > "$S/make.log" 2>&1; then
    fail setup "make build/gen librt_cpu.a ref stcompare failed: $(tail -n 1 "$S/make.log")"
    finish
fi
REF=build/ref/gpt2_ref
# tiny (models/tiny.lua, seq 64) and tiny_moe: one init each, one token file
$REF --layers 8 --hidden 64 --heads 4 --seq 64 --vocab 256 --random-init 7 \
     --save-init "$S/tiny.init.safetensors" > "$S/ref.log" 2>&1 &&
$REF --layers 4 --hidden 64 --heads 4 --seq 64 --vocab 256 --experts 8 --top-k 2 \
     --expert-ffn 128 --aux-coeff 0.01 --random-init 7 --save-init "$S/moe.init.safetensors" \
     >> "$S/ref.log" 2>&1 &&
build/ref/make_tokens --vocab 256 --tokens 20000 --seed 3 "$S/tiny.bin" >> "$S/ref.log" 2>&1 || {
    fail setup "cannot make the init or token files: $(tail -n 1 "$S/ref.log")"
    finish
}

equiv tests/cp/layouts.txt
equiv tests/cp/gpu.txt --cuda
finish
