#!/bin/bash
# tests/precision/suite.sh: bf16 mixed precision and activation recompute (docs/megatron.md §9)
# end to end. The runs are data, read by tests/lib.sh's equivalence runner:
# tests/precision/bf16.txt (bf16 tracks f32 on one rank; every layout in bf16 tracks the
# single-rank bf16 program; a control) and tests/precision/recompute.txt (recompute changes no
# number, bit for bit, f32 and bf16, with PP and VP, TP and SP, DP and the distributed
# optimizer, MoE), and tests/precision/gpu.txt (CUDA: built here, run on a GPU). Here: the
# inits, and the checks that are not comparisons of two runs: bf16 checkpoints (--save writes
# the f32 main weights; load and save round-trip bit for bit; --resume continues bit for bit),
# and the memory target of the headline layout.
# Every training run also checks its memory plan (tests/lib.sh: planned == allocated).
. "$(dirname "$0")/../lib.sh" precision

if ! make -s --no-print-directory build/gen build/librt_cpu.a ref build/tools/stcompare \
        > "$S/make.log" 2>&1; then
    fail setup "make build/gen librt_cpu.a ref stcompare failed: $(tail -n 1 "$S/make.log")"
    finish
fi
REF=build/ref/gpt2_ref
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

equiv tests/precision/bf16.txt
equiv tests/precision/recompute.txt
equiv tests/precision/gpu.txt --cuda

# -- bf16 checkpoints -----------------------------------------------------------------------------

# --save writes F32 tensors (the main weights), and a bf16 program that loads them and saves
# them again (--steps 0) writes the same bits: the main weights are the loaded values.
name=bf16-tp2-dp2-sp-distopt
if [ -n "${DIR[$name]}" ] && [ -f "$S/run/$name.safetensors" ]; then
    if ! $STCOMPARE --list "$S/run/$name.safetensors" 2> /dev/null | grep -q 'F32'; then
        fail save-f32 "$name's --save holds no F32 tensor"
    elif $STCOMPARE --list "$S/run/$name.safetensors" 2> /dev/null | grep -q 'BF16'; then
        fail save-f32 "$name's --save holds BF16 tensors (it must write the f32 main weights)"
    else
        pass save-f32
    fi
    if run_prog "${DIR[$name]}/train" "${WORLD[$name]}" "$S/run/roundtrip.log" --quiet \
            --init "$S/run/$name.safetensors" --steps 0 --save "$S/run/roundtrip.safetensors" &&
       $STCOMPARE -q --exact "$S/run/roundtrip.safetensors" "$S/run/$name.safetensors" \
            > "$S/run/roundtrip.cmp" 2>&1; then
        pass checkpoint-roundtrip
    else
        fail checkpoint-roundtrip "load + save of the f32 main weights is not the identity"
    fi
else
    skip save-f32 "no run of $name"
    skip checkpoint-roundtrip "no run of $name"
fi

# --resume: 6 steps straight, against 4 steps with a checkpoint after 3, resumed to 6.
name=bf16-tp2-pp2-dp2-sp-distopt
if [ -n "${DIR[$name]}" ]; then
    ck=$S/ckpt
    rm -rf "$ck"
    flags="--init $S/tiny.init.safetensors --data $S/tiny.bin --quiet --decay-steps 6"
    # shellcheck disable=SC2086 # the flags are words
    if run_prog "${DIR[$name]}/train" 8 "$S/run/straight.log" $flags --steps 6 \
            --log "$S/run/straight.jsonl" --save "$S/run/straight.safetensors" &&
       run_prog "${DIR[$name]}/train" 8 "$S/run/part1.log" $flags --steps 4 \
            --ckpt-dir "$ck" --ckpt-every 3 --log "$S/run/resumed.jsonl" &&
       run_prog "${DIR[$name]}/train" 8 "$S/run/part2.log" $flags --steps 6 \
            --ckpt-dir "$ck" --resume --log "$S/run/resumed.jsonl" \
            --save "$S/run/resumed.safetensors"; then
        if $LOGCMP "$S/run/resumed.jsonl" "$S/run/straight.jsonl" loss=exact grad_norm=exact \
                > "$S/run/resume.cmp" 2>&1 &&
           $STCOMPARE -q --exact "$S/run/resumed.safetensors" "$S/run/straight.safetensors" \
                >> "$S/run/resume.cmp" 2>&1; then
            pass resume
        else
            fail resume "the resumed run differs: $(tail -n 1 "$S/run/resume.cmp")"
        fi
    else
        fail resume "a run failed: $(first_error "$S/run/part2.log")"
    fi
else
    skip resume "no build of $name"
fi

# -- The headline layout fits: gpt3_175b TP 8 PP 8 DP 16, bf16, selective recompute ----------------

# docs: README "Mixed precision, recompute and memory". At most 48 GiB on every stage, on the
# CPU plan and on the GPU's (with the cuBLAS workspace and the NCCL estimate).
if build/gen gpt3_175b --tp 8 --pp 8 --dp 16 --nmb 64 --sp --dist-opt --bf16 \
        --recompute selective --dump memory > "$S/gpt3.memory.json" 2> "$S/gpt3.err"; then
    worst=$(build/gen --lua tests/precision/memory_check.lua "$S/gpt3.memory.json" 51539607552)
    case $worst in
    ok*) pass "gpt3-175b-fits ($worst)" ;;
    *) fail gpt3-175b-fits "$worst" ;;
    esac
else
    fail gpt3-175b-fits "build/gen failed: $(head -n 1 "$S/gpt3.err")"
fi
finish
