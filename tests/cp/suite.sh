#!/bin/bash
# tests/cp/suite.sh: context parallelism (docs/megatron.md §12) trains the same model as one
# rank. The runs and their references are data: tests/cp/layouts.txt (CP 2 and 4 with TP/SP,
# PP with VP, DP with the distributed optimizer, EP, bf16, recompute; both CP_COMM kinds),
# read by tests/lib.sh's equivalence runner, and tests/cp/gpu.txt (CUDA). Here: the inputs,
# and the checks that are not comparisons of two layouts: checkpoints load and save bit for bit
# on CP layouts, and --resume continues bit-exactly. (What a CP run communicates, traced, is
# what the generator declared: tests/program; the ring's verifier: tests/lua/cp_test.lua.)
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
     --expert-ffn 128 --aux-coeff 0.01 --no-linear-bias --random-init 7 \
     --save-init "$S/moe.init.safetensors" \
     >> "$S/ref.log" 2>&1 &&
build/ref/make_tokens --vocab 256 --tokens 20000 --seed 3 "$S/tiny.bin" >> "$S/ref.log" 2>&1 || {
    fail setup "cannot make the init or token files: $(tail -n 1 "$S/ref.log")"
    finish
}

equiv tests/cp/layouts.txt

# -- Checkpoints: the model file is layout-free, resume is bit-exact ----------------------------

# cp_run NAME TAG ARGS...: row NAME's program from the tiny init; $S/run/TAG.{log,jsonl,...}
cp_run() {
    local name=$1 tag=$2
    shift 2
    run_prog "${DIR[$name]}/train" "${WORLD[$name]}" "$S/run/$tag.log" --quiet \
        --init "$S/tiny.init.safetensors" --data "$S/tiny.bin" --steps 6 \
        --log "$S/run/$tag.jsonl" --save "$S/run/$tag.safetensors" "$@"
}

# Every CP layout loads the single-rank run's trained weights and saves them back bit for bit
# (--steps 0): a cp rank reads and writes the whole of its pieces (save owners: dp-cp rank 0).
ckpt_roundtrip cp_run "$S/run/tiny-1.safetensors" tiny-cp4 tiny-tp2-cp4-sp tiny-cp2-pp2-vp2 \
    tiny-cp4-dp2-distopt tiny-cp2-a2a

# --resume continues bit-exactly: CP 4 x DP 2 with DIST_OPT (AdamW state sharded over dp-cp = 8)
# stops after step 4 (its last checkpoint: step 3) and resumes to step 6: the log lines
# (timings aside) and the weights are the uninterrupted run's.
resume_check cp_run tiny-cp4-dp2-distopt 6

equiv tests/cp/gpu.txt --cuda
finish
