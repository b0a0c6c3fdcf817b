#!/bin/bash
# tests/lr/suite.sh: the learning-rate schedule (Megatron's, README.md "Learning rate") of the
# generated program (lib/lr.c) and of the reference (build/ref/gpt2_ref), each style against
# tests/lr/megatron_lr.py, an independent implementation of Megatron's scheduler as its
# training loop drives it (evaluated before the first step, advanced by the global batch after
# each). Both sides must agree exactly: the program's rate is the float32 of Megatron's double,
# the reference's is that double. The program's side is the library's schedule as a function
# (build/lr/lr_table: lib_lr over the flags as the program parses them), and once, for the
# style where the global batch counts, a whole run of the program (its log: the step count,
# the global batch and the rate as the program passes them). The reference's side is its log,
# from a model of one small layer (the rate does not depend on the model). Also: a WSD run
# resumes bit-exactly, and every bad combination of the LR flags is a usage error naming the
# flag, in both programs.
# Prints PASS/FAIL/SKIP lr/<name> (tests/lib.sh); scratch in build/test/lr/.
. "$(dirname "$0")/../lib.sh" lr
REF=build/ref/gpt2_ref
PY=python3
MEG="$PY tests/lr/megatron_lr.py"

if ! command -v "$PY" > /dev/null; then
    skip all "python3 not found"
    finish
fi
if ! make -s --no-print-directory build/gen build/librt_cpu.a build/libgpt_cpu.a ref \
        build/tools/stcompare build/lr/lr_table > "$S/make.log" 2>&1; then
    head -n 20 "$S/make.log"
    fail setup "make build/gen librt_cpu.a libgpt_cpu.a ref stcompare lr_table failed"
    finish
fi
LRT=build/lr/lr_table

# tiny (8 layers, C 64, T 64, V 256) with a global batch of 4 = mbs 2 x nmb 2: the scheduler
# counts samples, 4 a step, which inverse-square-root without warm-up can tell from steps.
MBS=2 NMB=2 GBS=4
if ! gen_build "$S/tiny" tiny --mbs $MBS --nmb $NMB; then
    fail setup "$WHY"
    finish
fi
A=$S/tiny/train
REFM="--layers 8 --hidden 64 --heads 4 --seq 64 --vocab 256"
if ! build/ref/make_tokens --vocab 256 --tokens 20000 "$S/tok.bin" > "$S/data.log" 2>&1 ||
   ! $REF $REFM --random-init 7 --save-init "$S/init.safetensors" > "$S/init.log" 2>&1; then
    cat "$S/data.log" "$S/init.log" | head -n 20
    fail setup "cannot make the token or init file"
    finish
fi

# -- Each style: 14 steps, so warm-up, decay and the steps past --decay-steps are all seen -----
STEPS=14
W="--warmup 3 --decay-steps 10"
WSD="--lr-decay-style WSD --warmup 2 --decay-steps 10 --lr-wsd-decay-iters 4"
# the reference's model for the schedules: one small layer (its rate is the schedule's alone)
REFS="--layers 1 --hidden 8 --heads 1 --seq 8 --vocab 256 --random-init 7"
# the style whose rates the program's whole run must give too: inverse square root without
# warm-up, the one where the global batch counts (max(W, 1) is one sample)
RUN=inverse-sqrt-nowarmup
# style NAME LR-FLAGS...: the library's schedule and the reference with LR-FLAGS, each against
# megatron_lr.py (and for $RUN the program's log); PASS NAME when all agree with it exactly
style() {
    local name=$1 why=""
    shift
    $LRT --gbs $GBS --data "$S/tok.bin" --steps $STEPS "$@" > "$S/$name.lib.jsonl" \
        2> "$S/$name.lib.log" || why="lr_table failed: $(head -n 1 "$S/$name.lib.log")"
    [ -z "$why" ] && [ $name = $RUN ] && ! run_prog "$A" 1 "$S/$name.prog.log" --quiet \
            --init "$S/init.safetensors" --data "$S/tok.bin" --steps $STEPS \
            --log "$S/$name.prog.jsonl" "$@" &&
        why="the program failed: $(first_error "$S/$name.prog.log")"
    # shellcheck disable=SC2086 # the model's flags are words
    [ -z "$why" ] && ! $REF $REFS --data "$S/tok.bin" --steps $STEPS --mbs $MBS --nmb $NMB \
            --log "$S/$name.ref.jsonl" "$@" > "$S/$name.ref.log" 2>&1 &&
        why="the reference failed: $(first_error "$S/$name.ref.log")"
    [ -z "$why" ] && ! $MEG --steps $STEPS --gbs $GBS "$@" --log "$S/$name.lib.jsonl" --f32 \
            > "$S/$name.cmp" 2>&1 && why="the library's rates (lib_lr) are not Megatron's"
    [ -z "$why" ] && [ $name = $RUN ] &&
        ! $MEG --steps $STEPS --gbs $GBS "$@" --log "$S/$name.prog.jsonl" --f32 \
            >> "$S/$name.cmp" 2>&1 && why="the program's rates are not Megatron's"
    [ -z "$why" ] && ! $MEG --steps $STEPS --gbs $GBS "$@" --log "$S/$name.ref.jsonl" --f64 \
            >> "$S/$name.cmp" 2>&1 && why="the reference's rates are not Megatron's"
    if [ -n "$why" ]; then
        sed 's/^/  /' "$S/$name.cmp" 2> /dev/null | head -n 8
        fail "$name" "$why"
    else
        pass "$name"
    fi
}
style defaults
style cosine $W
style cosine-init $W --lr-warmup-init 1e-4 --min-lr 0
style constant --lr-decay-style constant $W
style linear --lr-decay-style linear $W --lr 1e-3 --min-lr 1e-4
style inverse-sqrt --lr-decay-style inverse-square-root $W --min-lr 3.5e-4
style inverse-sqrt-nowarmup --lr-decay-style inverse-square-root --decay-steps 10
style wsd-exponential $WSD
style wsd-linear $WSD --lr-wsd-decay-style linear
style wsd-cosine $WSD --lr-wsd-decay-style cosine --lr-warmup-init 2e-4
style wsd-minus-sqrt $WSD --lr-wsd-decay-style minus_sqrt --min-lr 0

# The shift itself, without the script: with warm-up the first step runs at --lr-warmup-init
# (0) and the peak comes at step W + 1; without, the first step runs at --lr.
first() { sed -n "${2}s/.*\"lr\":\([^,}]*\).*/\1/p" "$1"; }
got="$(first "$S/cosine.ref.jsonl" 1) $(first "$S/cosine.ref.jsonl" 4)"
got="$got $(first "$S/defaults.ref.jsonl" 1)"
if echo "$got" | awk '{ d = $2 - 6e-4; e = $3 - 6e-4
                        exit !(NF == 3 && $1 == 0 && d * d < 1e-30 && e * e < 1e-30) }'; then
    pass shifted
else
    fail shifted "lr of step 1 and 4 (warm-up 3), step 1 (none): $got, want 0 6e-4 6e-4"
fi

# -- A WSD run stopped after step 6 (checkpoint after 4) and resumed to 14 is the straight run --
ck=$S/ckpt
HP="--init $S/init.safetensors --data $S/tok.bin --quiet $WSD --lr-wsd-decay-style cosine"
if run_prog "$A" 1 "$S/straight.log" $HP --steps $STEPS --log "$S/straight.jsonl" \
        --save "$S/straight.safetensors" &&
   run_prog "$A" 1 "$S/part1.log" $HP --steps 6 --ckpt-dir "$ck" --ckpt-every 4 \
        --log "$S/resumed.jsonl" &&
   run_prog "$A" 1 "$S/part2.log" $HP --steps $STEPS --ckpt-dir "$ck" --resume \
        --log "$S/resumed.jsonl" --save "$S/resumed.safetensors"; then
    if $LOGCMP "$S/resumed.jsonl" "$S/straight.jsonl" loss=exact lr=exact grad_norm=exact \
            > "$S/resume.cmp" 2>&1 &&
       $STCOMPARE -q --exact "$S/resumed.safetensors" "$S/straight.safetensors" \
            >> "$S/resume.cmp" 2>&1; then
        pass resume-wsd
    else
        sed 's/^/  /' "$S/resume.cmp" | head -n 8
        fail resume-wsd "the resumed run differs from the straight one"
    fi
else
    fail resume-wsd "a run failed: $(first_error "$S/part2.log")"
fi

# -- Usage errors (exit 2), the same cases in both programs -----------------------------------
# expect NAME 'program message' 'reference message' LR-FLAGS...
expect() {
    local name=$1 want_prog=$2 want_ref=$3 rc got
    shift 3
    "$A" --data "$S/tok.bin" --steps 2 "$@" > "$S/err-$name.out" 2> "$S/err-$name.err"
    rc=$?
    got=$(head -n 1 "$S/err-$name.err")
    if [ $rc -ne 2 ] || [ "$got" != "train: error: $want_prog" ]; then
        fail "err-$name" "program: exit $rc, '$got' (want 2, 'train: error: $want_prog')"
        return
    fi
    $REF $REFM --random-init 1 --data "$S/tok.bin" --steps 2 "$@" \
        > "$S/err-$name.ref.out" 2> "$S/err-$name.ref.err"
    rc=$?
    got=$(head -n 1 "$S/err-$name.ref.err")
    if [ $rc -ne 2 ] || [ "$got" != "gpt2_ref: error: $want_ref" ]; then
        fail "err-$name" "reference: exit $rc, '$got' (want 2, 'gpt2_ref: error: $want_ref')"
    else
        pass "err-$name"
    fi
}
m="--lr-decay-style must be cosine, constant, linear, inverse-square-root or WSD, got 'step'"
expect style "$m" "$m" --lr-decay-style step
m="--lr-decay-style WSD needs --lr-wsd-decay-iters N (the number of steps of its final decay)"
expect wsd-no-iters "$m" "$m" --lr-decay-style WSD
expect wsd-iters-too-many "--lr-wsd-decay-iters (3) must be <= --decay-steps (2)" \
    "--lr-wsd-decay-iters (3) must be in [0, --decay-steps (2)]" \
    --lr-decay-style WSD --lr-wsd-decay-iters 3
m="--lr-wsd-decay-style must be exponential, linear, cosine or minus_sqrt, got 'sqrt'"
expect wsd-style "$m" "$m" --lr-decay-style WSD --lr-wsd-decay-iters 1 --lr-wsd-decay-style sqrt
m="--lr-wsd-decay-iters needs --lr-decay-style WSD"
expect wsd-iters-without-wsd "$m" "$m" --lr-wsd-decay-iters 1
m="--lr-warmup-init (0.001) must be <= --lr (0.0006)"
expect warmup-init "$m" "$m" --lr-warmup-init 1e-3
expect min-above-max "the learning rates must satisfy 0 <= --min-lr (0.001) <= --lr (0.0006)" \
    "--min-lr (0.001) must be <= --lr (0.0006)" --min-lr 1e-3
m="--decay-steps must be >= 1 (the step count after which the rate is min-lr)"
expect decay-zero "$m" "$m" --decay-steps 0
finish
