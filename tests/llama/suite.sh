#!/bin/bash
# tests/llama/suite.sh: the Llama family end to end (docs/llama.md). The runs are data:
# tests/llama/layouts.txt (tiny_llama on TP, SP, PP, VP, DP, DIST_OPT, CP, recompute, bf16; a
# tied-embedding variant over PP; groups of 4 query heads on TP and CP; tiny_mixtral on EP,
# ETP, EDP -- against the single-rank program and the double-precision reference) and
# tests/llama/gpu.txt (CUDA), run by tests/lib.sh's equivalence runner. Here: the inits those
# runs start from, and the checks that are not a comparison of two runs: checkpoints are
# layout-free (a TP 2 x PP 2 save loads at TP 1 and gives the same next step; load + save is
# the identity on several layouts), --resume is bit-exact, and `make inspect` states the
# published models' parameter counts.
. "$(dirname "$0")/../lib.sh" llama

# -- Prerequisites ------------------------------------------------------------------------------

if ! make -s --no-print-directory build/gen build/librt_cpu.a ref build/tools/stcompare \
        > "$S/make.log" 2>&1; then
    fail setup "make build/gen librt_cpu.a ref stcompare failed: $(tail -n 1 "$S/make.log")"
    finish
fi
REF=build/ref/gpt2_ref
SHAPE="--arch llama --layers 8 --hidden 64 --heads 8 --kv-heads 4 --ffn 128 --seq 64 --vocab 256"
MIXTRAL="--arch llama --layers 4 --hidden 64 --heads 8 --kv-heads 4 --ffn 128 --seq 64 \
--vocab 256 --experts 8 --top-k 2 --expert-ffn 128 --aux-coeff 0.01"
# shellcheck disable=SC2086 # flag lists are words
if ! { $REF $SHAPE --random-init 7 --save-init "$S/llama.init.safetensors" &&
       $REF $SHAPE --tie-embeddings --random-init 7 --save-init "$S/tied.init.safetensors" &&
       $REF ${SHAPE/--kv-heads 4/--kv-heads 2} --random-init 7 \
           --save-init "$S/gqa4.init.safetensors" &&
       $REF $MIXTRAL --random-init 7 --save-init "$S/mixtral.init.safetensors" &&
       $REF $MIXTRAL --score-function sigmoid --bias-update-rate 0.01 --random-init 7 \
           --save-init "$S/mixtral-ebias.init.safetensors" &&
       $REF $MIXTRAL --shared-expert-ffn 96 --random-init 7 \
           --save-init "$S/mixtral-shared.init.safetensors" &&
       build/ref/make_tokens --vocab 256 --tokens 20000 --seed 3 "$S/tokens.bin"
     } > "$S/setup.log" 2>&1; then
    fail setup "cannot make the inits or the token file: $(tail -n 1 "$S/setup.log")"
    finish
fi

equiv tests/llama/layouts.txt

# -- Checkpoints: Hugging Face names, layout-free, bit-exact resume -----------------------------

# llama_run NAME TAG ARGS...: row NAME's program from its init with the table's data;
# $S/run/TAG.{log,jsonl,safetensors}
llama_run() {
    local name=$1 tag=$2 init=llama
    shift 2
    case $name in mixtral-ebias*) init=mixtral-ebias ;; mixtral-shared*) init=mixtral-shared ;;
                  mixtral*) init=mixtral ;;
                  tied*) init=tied ;; esac
    run_prog "${DIR[$name]}/train" "${WORLD[$name]}" "$S/run/$tag.log" --quiet \
        --init "$S/$init.init.safetensors" --data "$S/tokens.bin" --steps 6 --warmup 2 \
        --log "$S/run/$tag.jsonl" --save "$S/run/$tag.safetensors" "$@"
}

# Layouts load the single-rank run's trained weights and --save them back bit for bit
# (--steps 0): every q/k/v/o, gate/up/down, lm_head and expert piece is read from and written
# to its place, once.
ckpt_roundtrip llama_run "$S/run/llama-1.safetensors" llama-tp2-pp2-sp llama-tp4-sp \
    llama-pp4-vp2 llama-tp2-pp2-dp2-sp-distopt llama-cp2
CKPT_VERDICT=checkpoint-roundtrip-mixtral ckpt_roundtrip llama_run \
    "$S/run/mixtral-1.safetensors" mixtral-tp2-etp2-sp mixtral-tp2-dp2-ep4-etp1-sp-distopt \
    mixtral-tp2-dp2-ep2-etp2-sp mixtral-pp2-dp2-ep2-distopt
CKPT_VERDICT=checkpoint-roundtrip-tied ckpt_roundtrip llama_run "$S/run/tied-1.safetensors" \
    tied-pp2-tp2-sp

# A checkpoint saved at TP 2 x PP 2 (the table's trained run) loads at TP 1 and gives the same
# next step: the first step from it has the TP 2 x PP 2 program's loss and gradient norm on
# the same batch (the fp32 tolerance of the table: 1e-5).
step1() { sed -n "1s/.*\"$2\":\([-+0-9.eE]*\).*/\1/p" "$1"; }
saved=$S/run/llama-tp2-pp2-sp.safetensors
if [ -z "${DIR[llama-1]}" ] || [ -z "${DIR[llama-tp2-pp2-sp]}" ] || [ ! -f "$saved" ]; then
    fail tp2-pp2-to-tp1 "the runs llama-1 and llama-tp2-pp2-sp are missing"
elif ! { llama_run llama-1 next-tp1 --init "$saved" --steps 1 &&
         llama_run llama-tp2-pp2-sp next-tp2pp2 --init "$saved" --steps 1; } \
        > "$S/next.log" 2>&1; then
    fail tp2-pp2-to-tp1 "a run failed: $(first_error "$S/run/next-tp1.log")"
else
    bad=""
    for key in loss grad_norm; do
        a=$(step1 "$S/run/next-tp1.jsonl" $key)
        b=$(step1 "$S/run/next-tp2pp2.jsonl" $key)
        awk -v a="$a" -v b="$b" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d
                                         exit !(a != "" && b != "" && d <= 1e-5) }' ||
            bad="$bad $key $a vs $b;"
    done
    if [ -n "$bad" ]; then fail tp2-pp2-to-tp1 "TP 1 from the TP 2 x PP 2 checkpoint:$bad"
    else pass tp2-pp2-to-tp1; fi
fi

# --resume continues bit-exactly: TP 2 x PP 2 x DP 2 with SP and DIST_OPT stops after step 4
# (its last checkpoint: step 3) and resumes to step 6.
resume_check llama_run llama-tp2-pp2-dp2-sp-distopt 6

# -- The report: exact parameter counts and memory (make inspect) -------------------------------

# inspect_has NAME WANT ARGS...: `make inspect ARGS` prints a line starting with WANT
inspect_has() {
    local name=$1 want=$2
    shift 2
    if make -s --no-print-directory inspect "$@" > "$S/$name.txt" 2>&1 &&
       grep -qF -- "$want" "$S/$name.txt"; then
        pass "$name"
    else
        fail "$name" "make inspect $* lacks '$want': $(head -n 1 "$S/$name.txt")"
    fi
}
inspect_has inspect-llama3-8b "params    8,030,261,248 unique (0 in experts)" MODEL=llama3_8b TP=8
inspect_has inspect-llama3-70b "params    70,553,706,496 unique (0 in experts)" \
    MODEL=llama3_70b TP=8 PP=4
inspect_has inspect-mixtral "params    46,702,792,704 unique (45,097,156,608 in experts)" \
    MODEL=mixtral_8x7b TP=2 EP=8 DP=8 SP=1
inspect_has inspect-llama-line "llama     RMSNorm eps 1e-05, SwiGLU, rotary positions (theta 500000), 8 kv heads (grouped-query: 8 query heads each), no biases, untied LM head" \
    MODEL=llama3_70b TP=8 PP=4

equiv tests/llama/gpu.txt --cuda
finish
