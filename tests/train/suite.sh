#!/bin/bash
# tests/train/suite.sh: the generated single-rank training program (models/tiny.lua) end to end:
# against the double-precision reference (losses, final weights), gradient accumulation,
# safetensors round trips and dtypes, bit-exact --resume, every bad-input message, llm.c shards,
# the tokenizer and `make data`, the log format, generator determinism and warnings, and the
# GPT-2 124M CPU + CUDA builds. Prints PASS/FAIL/SKIP train/<name> (tests/lib.sh); scratch in
# build/test/train/. Helpers: tests/train/fixtures.lua (file surgery), tests/logcmp.lua.
#
# Tolerances (the reasons, in short; numbers observed are in the FAIL/verbose output):
#   vs reference, losses: 1e-5 relative (observed ~3e-7). Both runs start from the same F32
#     weights and batches; ours computes in f32 (u = 6e-8), the reference in double. Per-op
#     errors are ~1e-6 of the scale (tests/kernels), the loss is a mean of 512 token losses,
#     and 10 Adam steps of lr <= 6e-4 move weights by < 1e-2, so rounding cannot reach 1e-5;
#     any semantic slip (a wrong scale, mask, decay target or schedule point) is >= 1e-4.
#   lr: 1e-6 relative: the rate is computed in double and passed as f32 (one rounding, 6e-8).
#   grad_norm: 1e-5 relative, as the loss (a sum of squares of f32 gradients).
#   vs reference, weights: |a - b| <= 1e-5 + 1e-5*|b| (observed max 1.2e-6). Adam divides
#     by sqrt(v), so an element whose gradient is at f32 noise level can move up to ~lr per
#     step differently; in practice only a few of 420k elements reach 1e-6. A decay applied to
#     a LayerNorm weight (lr*wd*1 = 6e-5 per step) or a missed clip step is caught.
#   (MBS=4, NMB=1) vs (MBS=1, NMB=4): 1e-5 relative on loss and grad_norm (observed 5e-7):
#     only the f32 summation order of the gradients differs.
#   --resume, shards vs .bin, round trips: exact (same program, same inputs, same order).
. "$(dirname "$0")/../lib.sh" train
FIX="lua5.4 tests/train/fixtures.lua"
STC=$STCOMPARE
REF=build/ref/gpt2_ref

show() { sed 's/^/  /' "$1" | head -n "${2:-20}"; }     # a log, indented, for a FAIL

# -- Setup --------------------------------------------------------------------------------------
if ! make -s --no-print-directory build/gen build/librt_cpu.a ref build/tools/stcompare \
        build/tools/tokenize > $S/make.log 2>&1; then
    show $S/make.log
    fail setup "make build/gen librt_cpu.a ref stcompare tokenize failed"
    finish
fi
if ! command -v lua5.4 > /dev/null; then
    fail setup "lua5.4 not found (make deps)"
    finish
fi

# verdict NAME WHY LOG CHECK...: PASS NAME if the shell function or command CHECK succeeds
# (its output goes to LOG), else show LOG and FAIL NAME: WHY.
verdict() {
    name=$1 why=$2 log=$3
    shift 3
    if "$@" > $log 2>&1; then pass "$name"
    else show $log 30; fail "$name" "$why"; fi
}

# The model's sizes, from the generator (models/tiny.lua), for the reference's command line.
build/gen tiny --dump config > $S/config.json 2>&1
get() { sed -n "s/^    \"$1\": \([0-9]*\),*$/\1/p" $S/config.json | head -n 1; }
L=$(get layers) C=$(get hidden) H=$(get heads) T=$(get seq_len) V=$(get vocab)
if [ -z "$L" ] || [ -z "$C" ] || [ -z "$H" ] || [ -z "$T" ] || [ -z "$V" ]; then
    show $S/config.json
    fail setup "cannot read the sizes of models/tiny.lua from build/gen --dump config"
    finish
fi
REFM="--layers $L --hidden $C --heads $H --seq $T --vocab $V"
NTENSORS=$((4 + 12 * L))

# build NAME GEN-ARGS...: generate tiny into $S/NAME and build its CPU program
build() {
    name=$1
    shift
    if ! build/gen tiny "$@" --out $S/$name > $S/$name.gen.log 2>&1 ||
       ! make -s --no-print-directory GEN_DIR=$S/$name GEN_OBJ=$S/obj/$name $S/$name/train \
            > $S/$name.make.log 2>&1; then
        cat $S/$name.gen.log $S/$name.make.log | sed 's/^/  /' | head -n 20
        fail setup "tiny $* does not generate or build"
        finish
    fi
}
build a --mbs 4 --nmb 2
build b41 --mbs 4 --nmb 1
build b14 --mbs 1 --nmb 4
A=$S/a/train

# Data (synthetic, learnable) and one initial model, written by the reference.
if ! build/ref/make_tokens --vocab "$V" --tokens 20000 $S/tok.bin > $S/data.log 2>&1 ||
   ! build/ref/make_tokens --vocab "$V" --tokens 20000 --shard $S/tok_shard.bin \
        >> $S/data.log 2>&1 ||
   ! $REF $REFM --random-init 7 --save-init $S/init.safetensors > $S/init.log 2>&1; then
    cat $S/data.log $S/init.log | sed 's/^/  /' | head -n 20
    fail setup "cannot make the token or init files"
    finish
fi
INIT=$S/init.safetensors

# Warm-up 3 steps (Megatron's: steps 1-4 at 0, lr/3, 2lr/3, lr), cosine to min-lr after 10
# steps (the rate of step 11), clipping at 2.5 (the norms of this run go from ~5.7 to
# ~1.9, so about half the steps are clipped; checked below on the reference's log).
HP="--steps 10 --lr 6e-4 --min-lr 6e-5 --warmup 3 --decay-steps 10 --beta1 0.9 --beta2 0.95"
HP="$HP --eps 1e-8 --wd 0.1 --clip 2.5"
CLIP=2.5
TOL="loss=1e-5 lr=1e-6 grad_norm=1e-5"       # logcmp against the reference (see the top)
SAME="loss=exact lr=exact grad_norm=exact"
WTOL="--atol 1e-5 --rtol 1e-5"                # stcompare against the reference (see the top)

# -- (a) against the reference ------------------------------------------------------------------
if ! $REF $REFM --init $INIT --data $S/tok.bin --mbs 4 --nmb 2 $HP --log $S/ref-a.jsonl \
        --save $S/ref-a.safetensors > $S/ref-a.log 2>&1; then
    show $S/ref-a.log
    fail setup "gpt2_ref failed"
    finish
fi
$A --init $INIT --data $S/tok.bin $HP --log $S/a.jsonl --save $S/a.safetensors \
    > $S/a.stdout 2> $S/a.stderr
rc=$?
# the run must exercise warm-up (rising lr from 0, peak at step 4) and clipping (norms on both
# sides of the clip)
norms=$(sed -n 's/.*"grad_norm":\([0-9.e+-]*\).*/\1/p' $S/ref-a.jsonl)
above=$(echo "$norms" | awk -v c=$CLIP '$1 > c' | wc -l)
below=$(echo "$norms" | awk -v c=$CLIP '$1 < c' | wc -l)
lrs=$(sed -n 's/.*"lr":\([0-9.e+-]*\).*/\1/p' $S/ref-a.jsonl | head -n 5 | tr '\n' ' ')
rising=$(echo "$lrs" | awk '{ print ($1 == 0 && $1 < $2 && $2 < $3 && $3 < $4 && $5 < $4) }')
if [ "$above" -lt 1 ] || [ "$below" -lt 1 ] || [ "$rising" != 1 ]; then
    fail vs-ref-coverage "clipping or warm-up not exercised (norms above $CLIP: $above," \
        "below: $below; lr $lrs)"
else
    pass "vs-ref-coverage ($above of 10 steps clipped, warm-up 3 steps)"
fi
if [ $rc -ne 0 ]; then
    show $S/a.stderr
    fail vs-ref-losses "train exited with status $rc"
else
    verdict vs-ref-losses "losses, lr or grad norms differ from the reference" $S/cmp-a.log \
        $LOGCMP $S/a.jsonl $S/ref-a.jsonl $TOL
    verdict vs-ref-weights "final weights differ from the reference's" $S/cmp-aw.log \
        $STC -q $WTOL $S/a.safetensors $S/ref-a.safetensors
fi

# -- (j) the log: stdout line per step; JSONL keys exactly step, loss, lr, grad_norm, ms, comm_ms,
#        tok_s, tflops, mem_mib, mem_peak_mib, rss_mib
LINE='^step +[0-9]+/10 \| loss [0-9]+\.[0-9]+ \| lr [0-9]\.[0-9]+e[-+][0-9]+ '
LINE="$LINE"'\| norm [0-9]+\.[0-9]+ \| +[0-9]+\.[0-9] ms \| +[0-9]+ tok/s \| +[0-9]+\.[0-9]{3} '
LINE="$LINE"'TFLOP/s \| mem [0-9]+\.[0-9] MiB$'
n=$(grep -c -E "$LINE" $S/a.stdout)
if [ "$n" = 10 ]; then pass log-stdout
else
    show $S/a.stdout
    fail log-stdout "$n of 10 lines read 'step N/10 | loss | lr | norm | ms | tok/s | TFLOP/s | mem'"
fi
# the first line: the model, its parameters (GPT-2: V*C + T*C + L*(12C^2 + 13C) + 2C, counted
# here from the model's sizes), the layout and the batch; a periodic checkpoint says so
P=$((V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C))
want="train: models/tiny.lua, $((P / 1000000)).$(printf %03d $((P % 1000000 / 1000))) M parameters, tp1\
 pp1 dp1 (world 1): global batch 8 sequences (MBS 4 x NMB 2 x DP 1) of $T tokens, $((8 * T)) tokens\
 per step; from step 1"
if [ "$(grep -m1 '^train: ' $S/a.stdout)" = "$want" ]; then pass log-header
else fail log-header "got '$(grep -m1 '^train: ' $S/a.stdout)', want '$want'"
fi
verdict log-jsonl "the --log file is not 10 lines of step, loss, lr, grad_norm, ms, comm_ms, tok_s, \
tflops, mem_mib, mem_peak_mib, rss_mib" \
    $S/keys.log $FIX logkeys $S/a.jsonl 10

# -- (b) gradient accumulation: (MBS=4, NMB=1) and (MBS=1, NMB=4) -------------------------------
accumulation() {
    $REF $REFM --init $INIT --data $S/tok.bin --mbs 4 --nmb 1 $HP --log $S/ref-b.jsonl &&
    $S/b41/train --init $INIT --data $S/tok.bin $HP --log $S/b41.jsonl \
        --save $S/b41.safetensors --quiet &&
    $S/b14/train --init $INIT --data $S/tok.bin $HP --log $S/b14.jsonl \
        --save $S/b14.safetensors --quiet &&
    $LOGCMP $S/b14.jsonl $S/b41.jsonl loss=1e-5 lr=exact grad_norm=1e-5 &&
    $LOGCMP $S/b41.jsonl $S/ref-b.jsonl $TOL &&
    $STC -q $WTOL $S/b14.safetensors $S/b41.safetensors
}
verdict accumulation "(MBS=4, NMB=1) and (MBS=1, NMB=4) differ beyond rounding (or failed)" \
    $S/b.log accumulation

# -- (c) safetensors round trip ---------------------------------------------------------------
keys() { $STC --list "$1" | awk '{ $NF = ""; $(NF - 1) = ""; print }' | sort; }
if ! $A --steps 0 --init $INIT --save $S/rt.safetensors > $S/rt.log 2>&1; then
    show $S/rt.log
    fail st-roundtrip "train --steps 0 --init --save failed"
else
    verdict st-roundtrip "--init A --save B changed values" $S/rt-cmp.log \
        $STC --exact -q $S/rt.safetensors $INIT
    verdict st-header-strict "the saved file fails the strict header check" $S/rt-check.log \
        $STC --check --dtype F32 $S/rt.safetensors
    # names, dtypes and shapes as the reference writes them (Hugging Face GPT-2 layout)
    keys $S/rt.safetensors > $S/rt.keys
    keys $INIT > $S/init.keys
    verdict st-keys-shapes "tensor names, dtypes or shapes differ from the reference's" \
        $S/keys-diff.log diff $S/rt.keys $S/init.keys
    loads_in_reference() {
        $REF $REFM --init $S/rt.safetensors --save-init $S/rt-ref.safetensors &&
        $STC --exact -q $S/rt-ref.safetensors $INIT
    }
    verdict st-loads-in-reference "gpt2_ref --init does not read our file back" \
        $S/rt-ref.log loads_in_reference
    resave() {
        $A --steps 0 --init $S/rt.safetensors --save $S/rt2.safetensors &&
        cmp $S/rt.safetensors $S/rt2.safetensors
    }
    verdict st-save-deterministic "saving the same model twice gives different bytes" \
        $S/rt2.log resave
fi

# -- tools/stcompare, the instrument of these tests, must see what it is meant to -------------
$FIX nudge $INIT $S/nudge.safetensors wpe.weight 77
$FIX unaligned $INIT $S/unaligned.safetensors
$FIX gap $INIT $S/gap.safetensors
$FIX drop $INIT $S/drop.safetensors h.3.ln_2.bias
$FIX reshape $INIT $S/shape.safetensors wpe.weight 32,$((2 * C))
one_ulp() {     # wpe.weight element 77 one ulp up: a mismatch for --exact, named; fine at 1e-6
    ! $STC --exact -q $S/nudge.safetensors $INIT > $S/stc1.out &&
    grep "^    \[$((77 / C)), $((77 % C))\] " $S/stc1.out &&
    grep "^wpe.weight  *1 of $((T * C)) differ .*MISMATCH$" $S/stc1.out &&
    $STC -q --atol 0 --rtol 1e-6 $S/nudge.safetensors $INIT
}
verdict stcompare-one-ulp "one ulp went unseen, unnamed, or not within 1e-6" $S/stc1.log one_ulp
missing_and_shape() {
    ! $STC -q $S/drop.safetensors $INIT > $S/stc2.out &&
    grep "^h.3.ln_2.bias  *only in $INIT$" $S/stc2.out &&
    ! $STC -q $S/shape.safetensors $INIT > $S/stc3.out &&
    grep "^wpe.weight  *shape \[32, $((2 * C))\] vs \[$T, $C\]  DIFFERENT SHAPE$" $S/stc3.out
}
verdict stcompare-missing-and-shape "a missing tensor or a shape change went unreported" \
    $S/stc2.log missing_and_shape
strict_check() {
    ! $STC --check $S/unaligned.safetensors 2> $S/stc4.out &&
    grep 'is not a multiple of 8' $S/stc4.out &&
    ! $STC --check $S/gap.safetensors 2> $S/stc5.out &&
    grep "tensor 'wpe.weight' starts at $((4 * V * C + 4)), expected $((4 * V * C))" $S/stc5.out &&
    $STC --check --dtype F32 $INIT
}
verdict stcompare-check "--check missed an unaligned header or a gap, or rejected a good file" \
    $S/stc3.log strict_check

# -- (d) BF16 and F16 --init files load as their exact values -----------------------------------
# The fixture must round to nearest: within half an ulp of the mantissa (2^-8 for BF16, 2^-11
# for F16) relative, plus half the F16 subnormal spacing (2^-25) absolute.
dtype_init() {      # DTYPE RTOL ATOL
    lc=$(echo $1 | tr 'A-Z' 'a-z')
    f=$S/init-$lc.safetensors
    $FIX cast $1 $INIT $f &&
    $STC -q --rtol $2 --atol $3 $f $INIT &&
    $A --steps 0 --init $f --save $S/$lc-saved.safetensors &&
    $STC --exact -q $S/$lc-saved.safetensors $f &&
    $REF $REFM --init $f --save-init $S/$lc-ref.safetensors &&
    $STC --exact -q $S/$lc-saved.safetensors $S/$lc-ref.safetensors
}
verdict st-bf16 "a BF16 --init does not load as its exact values (as the reference reads it)" \
    $S/bf16.log dtype_init BF16 0.00390625 0
verdict st-f16 "an F16 --init does not load as its exact values (as the reference reads it)" \
    $S/f16.log dtype_init F16 0.00048828125 2.98023223876953125e-08

# -- (e) --resume is bit-exact; an unfinished checkpoint is ignored ----------------------------
resume() {
    CK="--ckpt-every 3"
    $A --init $INIT --data $S/tok.bin $HP --ckpt-dir $S/ck-full $CK --log $S/full.jsonl \
        --save $S/full.safetensors --quiet || { echo "the uninterrupted run failed"; return 1; }
    # "killed" after step 8: its last checkpoint is step 6; then a crash while writing step 9
    $A --init $INIT --data $S/tok.bin $HP --steps 8 --ckpt-dir $S/ck-part $CK \
        --log $S/part.jsonl --quiet || { echo "the first part failed"; return 1; }
    mkdir -p $S/ck-part/step_00000009.tmp $S/ck-part/step_00000012.tmp
    echo "half a checkpoint" > $S/ck-part/step_00000009.tmp/rank_00000.bin
    $A --data $S/tok.bin $HP --ckpt-dir $S/ck-part $CK --resume --log $S/part.jsonl \
        --save $S/part.safetensors > $S/resume.out || { echo "the resumed run failed"; return 1; }
    grep "^resumed from $S/ck-part/step_00000006$" $S/resume.out ||
        { echo "did not resume from step 6, the newest complete checkpoint"; return 1; }
    # the log keeps steps 1-6 of the first part and appends 7-10: the uninterrupted log
    $LOGCMP $S/part.jsonl $S/full.jsonl $SAME &&
    cmp $S/part.safetensors $S/full.safetensors &&
    cmp $S/ck-part/step_00000009/rank_00000.bin $S/ck-full/step_00000009/rank_00000.bin
}
verdict resume "resuming is not bit-exact (log, final weights or the step 9 checkpoint)" \
    $S/resume.log resume
resume_nothing() {
    $A --init $INIT --steps 0 --ckpt-dir $S/ck-none --resume &&
    $A --init $INIT --steps 0 --ckpt-dir $S/ck-none --resume |
        grep -q "^no complete checkpoint in $S/ck-none: starting from the beginning$"
}
verdict resume-nothing-yet "--resume without a checkpoint should say so and start over" \
    $S/resume-none.log resume_nothing

# -- (g) an llm.c shard trains exactly like the bare .bin of the same tokens -------------------
shard_same() {
    tail -c +1025 $S/tok_shard.bin | cmp - $S/tok.bin &&
    $A --init $INIT --data $S/tok_shard.bin $HP --log $S/shard.jsonl --quiet &&
    $LOGCMP $S/shard.jsonl $S/a.jsonl $SAME
}
verdict shard-same-as-bin "the llm.c shard and the .bin of the same tokens give different runs" \
    $S/shard.log shard_same

# -- (f) bad inputs: exact message (stderr, whole) and exit status -------------------------------
# expect NAME STATUS MESSAGE -- ARGS...: run train ARGS; stderr must be MESSAGE (lines) exactly
expect() {
    name=$1 want_rc=$2 want=$3
    shift 4
    $A "$@" > $S/err-$name.out 2> $S/err-$name.err
    rc=$?
    printf '%s\n' "$want" > $S/err-$name.want
    if [ $rc -ne "$want_rc" ]; then
        show $S/err-$name.err 5
        fail err-$name "exit status $rc, expected $want_rc"
    elif ! cmp -s $S/err-$name.err $S/err-$name.want; then
        diff $S/err-$name.want $S/err-$name.err | sed 's/^/  /' | head -n 10
        fail err-$name "the message differs (< expected, > got)"
    else
        pass err-$name
    fi
}
cp $S/tok.bin $S/oor.bin
printf '\054\001' | dd of=$S/oor.bin bs=1 seek=2000 conv=notrunc 2> /dev/null   # 300 at 1000
{ cat $S/tok.bin; printf 'x'; } > $S/odd.bin
head -c 40924 $S/tok_shard.bin > $S/trunc.bin                                  # 100 bytes short
head -c 128 $S/tok.bin > $S/short.bin
cp $S/tok_shard.bin $S/version.bin
printf '\002' | dd of=$S/version.bin bs=1 seek=4 conv=notrunc 2> /dev/null
D="--init $INIT --steps 1 --data"
m="token 300 at position 1000 is out of range: the model's vocabulary has $V ids"
expect data-token-range 1 "$S/oor.bin: error: $m (0..$((V - 1))); was the file made for \
another tokenizer?" -- $D $S/oor.bin
m="odd size (40001 bytes): expected little-endian uint16 tokens (nanoGPT .bin) or an llm.c"
expect data-odd-size 1 "$S/odd.bin: error: $m shard (magic 20240520)" -- $D $S/odd.bin
m="llm.c shard header announces 20000 tokens but 39900 bytes follow it (40000 expected)"
expect data-truncated-shard 1 "$S/trunc.bin: error: $m: truncated or corrupt" -- $D $S/trunc.bin
m="llm.c shard version 2; only version 1 (uint16 tokens) is supported"
expect data-shard-version 1 "$S/version.bin: error: $m" -- $D $S/version.bin
m="64 tokens: too short for one sample (sequence length $T needs $((T + 1)) tokens)"
expect data-too-short 1 "$S/short.bin: error: $m" -- $D $S/short.bin
expect data-missing 1 "$S/none.bin: error: cannot open: No such file or directory" \
    -- $D $S/none.bin

# a token file truncated while training: the read comes up short (errno is stale there)
truncated_in_use() {
    cp $S/tok.bin $S/shrinks.bin && rm -f $S/shrinks.jsonl
    $A --init $INIT --data $S/shrinks.bin --steps 2000 --quiet --log $S/shrinks.jsonl \
        > $S/shrinks.out 2> $S/shrinks.err &
    local pid=$! i
    for i in $(seq 1 1200); do [ -s $S/shrinks.jsonl ] && break; sleep 0.05; done
    : > $S/shrinks.bin
    wait $pid
    local rc=$?
    cat $S/shrinks.err
    [ $rc != 0 ] && grep -q "$S/shrinks.bin: cannot read sample [0-9]*: short read: 0 of \
[0-9]* bytes at byte [0-9]* (the file is shorter than when it was opened: truncated while in \
use?)" $S/shrinks.err
}
verdict data-truncated-in-use "a short read is not named as one" $S/shrinks.log truncated_in_use

# RT_THREADS above the online CPUs is capped to them, with one line saying so (1024 spinning
# threads on 2 CPUs made one tiny step take 90 s)
threads_capped() {
    local cpus
    cpus=$(getconf _NPROCESSORS_ONLN)
    RT_THREADS=1024 timeout -s KILL 60 $A --init $INIT --data $S/tok.bin --steps 1 --quiet \
        2> $S/threads.err || return 1
    cat $S/threads.err
    [ "$(cat $S/threads.err)" = "[rank 0/1] warning: RT_THREADS=1024 exceeds the $cpus online \
CPUs: using $cpus threads (more only wait on each other)" ]
}
verdict rt-threads-capped "RT_THREADS=1024 is not capped to the CPUs with one warning" \
    $S/threads.log threads_capped

NOT="error: not loaded (1 problem): --init needs the $NTENSORS tensors of this model, with"
NOT="$NOT Hugging Face GPT-2 names and shapes, in F32, BF16 or F16"
$FIX extra $INIT $S/extra.safetensors h.3.ln_2.scale
$FIX dtype $INIT $S/dtype.safetensors ln_f.bias I32
$FIX corrupt $INIT $S/corrupt.safetensors
$FIX hlen $INIT $S/hlen.safetensors
size=$(wc -c < $S/hlen.safetensors)
at=$(printf '{"__metadata__":{"format":"pt"},"wte.weight":{"dtype":"F32","shape":[%d,%d],%s' \
     "$V" "$C" '"data_offsets":' | wc -c)
I="--steps 0 --init"
f=$S/drop.safetensors
expect init-missing-tensor 1 "$f: error: missing tensor 'h.3.ln_2.bias' [$C]
$f: $NOT" -- $I $f
f=$S/extra.safetensors
expect init-extra-tensor 1 "$f: error: unexpected tensor 'h.3.ln_2.scale' (not a parameter of \
this model)
$f: $NOT" -- $I $f
f=$S/shape.safetensors
expect init-wrong-shape 1 "$f: error: tensor 'wpe.weight' has shape [32, $((2 * C))], \
expected [$T, $C]
$f: $NOT" -- $I $f
f=$S/dtype.safetensors
expect init-wrong-dtype 1 "$f: error: tensor 'ln_f.bias' has dtype 'I32'; expected F32, BF16 \
or F16
$f: $NOT" -- $I $f
f=$S/corrupt.safetensors
expect init-corrupt-header 1 "$f: error: malformed safetensors header (expected '[', at byte \
$at of the JSON)" -- $I $f
f=$S/hlen.safetensors
expect init-header-length 1 "$f: error: not a safetensors file (header length $size, file \
$size bytes)" -- $I $f
f=$S/none.safetensors
expect init-missing-file 1 "$f: error: cannot open: No such file or directory" -- $I $f
# every weight --init loads is finite: the first that is not is named (a NaN would otherwise
# surface as a gradient, an inf be saved as is)
FIN="every weight --init loads must be a finite number"
$FIX poke $INIT $S/nan.safetensors ln_f.bias 5 nan
$FIX poke $INIT $S/inf.safetensors h.1.attn.c_attn.weight 1000 inf
f=$S/nan.safetensors
expect init-nan-weight 1 "$f: error: tensor 'ln_f.bias' element 5 is nan: $FIN" -- $I $f
f=$S/inf.safetensors
expect init-inf-weight-save 1 "$f: error: tensor 'h.1.attn.c_attn.weight' element 1000 (row \
$((1000 / (3 * C))), column $((1000 % (3 * C)))) is inf: $FIN" -- $I $f --save $S/inf-out.st

expect flag-unknown 2 "train: error: unknown flag '--bogus' (try --help)" -- --bogus 1
expect flag-not-a-number 2 "train: error: --lr expects a number, got 'abc'" -- --lr abc
expect flag-not-an-integer 2 "train: error: --steps expects a non-negative integer, got 'ten'" \
    -- --steps ten
expect flag-no-value 2 "train: error: --steps needs a value (try --help)" -- --steps
expect flag-positional 2 "train: error: unexpected argument 'data.bin' (every flag starts with \
--; try --help)" -- data.bin
expect flag-decay-before-warmup 2 "train: error: --decay-steps (3) must be >= --warmup (5)" \
    -- --data $S/tok.bin --warmup 5 --decay-steps 3
expect flag-steps-without-data 2 "train: error: --data FILE is needed to train (or --steps 0)" \
    -- --steps 5
# Megatron's spellings (lib/flags.h LIB_FLAG_ALIASES) are the flags themselves: the same run,
# log for log
if $A --init $INIT --data $S/tok.bin --train-iters 3 --lr-warmup-iters 1 --lr-decay-iters 3 \
       --weight-decay 0.05 --adam-beta1 0.8 --adam-beta2 0.99 --adam-eps 1e-7 --clip-grad 0.5 \
       --quiet --log $S/alias-megatron.jsonl > $S/alias.out 2>&1 &&
   $A --init $INIT --data $S/tok.bin --steps 3 --warmup 1 --decay-steps 3 --wd 0.05 \
       --beta1 0.8 --beta2 0.99 --eps 1e-7 --clip 0.5 --quiet --log $S/alias-ours.jsonl \
       >> $S/alias.out 2>&1 &&
   diff <(sed 's/,"ms".*//' $S/alias-megatron.jsonl) <(sed 's/,"ms".*//' $S/alias-ours.jsonl) \
       > /dev/null && [ "$(wc -l < $S/alias-ours.jsonl)" = 3 ]; then
    pass megatron-flag-spellings
else
    show $S/alias.out 5
    fail megatron-flag-spellings "--train-iters ... --clip-grad did not run as --steps ... --clip"
fi
expect flag-megatron-spelling-named 2 "train: error: --weight-decay must be >= 0, got -1" \
    -- --steps 0 --weight-decay -1
expect flag-ckpt-without-dir 2 "train: error: --ckpt-every and --resume need --ckpt-dir DIR" \
    -- --steps 0 --ckpt-every 3
# the optimizer's numbers are 32-bit floats (gpt_step_in): each is checked as the float it becomes
F="train: error: --lr must be at most 3.40282e+38 in magnitude (the optimizer's numbers are \
32-bit floats)"
expect flag-lr-not-a-float 2 "$F, got 1e+39" -- --steps 0 --lr 1e39
expect flag-lr-above-float-max 2 "$F, got 3.5e+38" -- --steps 0 --lr 3.5e38
expect flag-beta1-rounds-to-1 2 "train: error: --beta1 must be in [0, 1), got 0.999999999999 \
(1 as the optimizer's 32-bit float)" -- --steps 0 --beta1 0.999999999999
expect flag-eps-negative 2 "train: error: --eps must be > 0, got -1" -- --steps 0 --eps -1
expect flag-eps-float-zero 2 "train: error: --eps must be > 0, got 1e-50 (0 as the optimizer's \
32-bit float)" -- --steps 0 --eps 1e-50
expect flag-wd-negative 2 "train: error: --wd must be >= 0, got -1" -- --steps 0 --wd -1
expect flag-clip-negative 2 "train: error: --clip must be >= 0 (0: no clipping), got -1" \
    -- --steps 0 --clip -1
expect flag-exit-grace-range 2 "train: error: --exit-grace must be at most 4294967295 seconds, \
got 1e+10" -- --steps 0 --exit-grace 1e10
# --tensorboard-dir: an event file whose records and messages an independent reader
# (tests/train/tb_read.py: the TFRecord framing, CRC-32C, the protocol buffers) accepts, the
# file_version first, and per step the log's loss, rate and gradient norm as floats, the
# throughput and the MFU; a second run beside it gets a file of its own; a resumed run's file
# starts with a SessionLog START at its first step
rm -rf $S/tb
if ! $A --init $INIT --data $S/tok.bin --steps 3 --tensorboard-dir $S/tb --peak-tflops 1 \
        --log $S/tb.jsonl --quiet > $S/tb.out 2>&1 ||
   ! python3 tests/train/tb_read.py $S/tb/events.out.tfevents.* > $S/tb.txt 2>&1; then
    show $S/tb.out 5
    show $S/tb.txt 5
    fail tensorboard "the run or the reader failed"
elif [ "$(head -n 1 $S/tb.txt)" != "version brain.Event:2" ] ||
     [ "$(grep -c ' throughput ' $S/tb.txt)" != 3 ] || [ "$(grep -c ' mfu ' $S/tb.txt)" != 3 ] ||
     ! python3 - $S/tb.jsonl $S/tb.txt <<'PY'
import json, struct, sys
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
log = [json.loads(l) for l in open(sys.argv[1])]
tb = {}
for line in open(sys.argv[2]):
    w = line.split()
    if w[0].isdigit():
        tb[(int(w[0]), " ".join(w[1:-1]))] = float(w[-1])
for e in log:
    for key, tag in (("loss", "lm loss"), ("lr", "learning-rate"), ("grad_norm", "grad-norm")):
        got = tb.get((e["step"], tag))
        if got is None or f32(got) != f32(e[key]):
            sys.exit("step %d %s: %s in the event file, %s in the log" % (e["step"], tag, got, e[key]))
    if abs(tb[(e["step"], "mfu")] - tb[(e["step"], "throughput")]) > 1e-6 * tb[(e["step"], "mfu")]:
        sys.exit("step %d: mfu is not throughput / 1" % e["step"])
    for key, tag in (("mem_mib", "mem-allocated-bytes"), ("mem_peak_mib", "mem-max-allocated-bytes"),
                     ("rss_mib", "mem-host-resident-bytes")):
        got = tb.get((e["step"], tag))
        if got is None or "%.1f" % (got / 2**20) != "%.1f" % e[key]:
            sys.exit("step %d %s: %s in the event file, %s MiB in the log" % (e["step"], tag, got, e[key]))
PY
then
    head -n 8 $S/tb.txt | sed 's/^/  /'
    fail tensorboard "the event file does not hold the log's numbers (above)"
elif ! $A --init $INIT --data $S/tok.bin --steps 1 --tensorboard-dir $S/tb --quiet \
        > $S/tb2.out 2>&1 || [ "$(ls $S/tb | wc -l)" != 2 ]; then
    show $S/tb2.out 5
    fail tensorboard "a second run did not write a file of its own beside the first"
elif ! { rm -rf $S/tbck $S/tb3 &&
         $A --init $INIT --data $S/tok.bin --steps 2 --ckpt-dir $S/tbck --ckpt-every 2 \
            --quiet && $A --init $INIT --data $S/tok.bin --steps 3 --ckpt-dir $S/tbck --resume \
            --tensorboard-dir $S/tb3 --quiet; } > $S/tb3.out 2>&1 ||
     [ "$(python3 tests/train/tb_read.py $S/tb3/events.out.tfevents.* 2>&1 |
          sed -n '2p;3p' | cut -d' ' -f1-3 | tr '\n' ,)" != "start 2,3 lm loss," ]; then
    show $S/tb3.out 5
    python3 tests/train/tb_read.py $S/tb3/events.out.tfevents.* 2>&1 | head -n 4 | sed 's/^/  /'
    fail tensorboard "a resumed run's file does not start with a SessionLog START at step 2, \
then step 3"
else
    pass tensorboard
fi
expect flag-log-interval-zero 2 "train: error: --log-interval must be >= 1, got 0" \
    -- --steps 0 --log-interval 0
expect flag-peak-tflops-zero 2 "train: error: --peak-tflops must be a device's peak in TFLOP/s, \
> 0 and below 1e9, got 0" -- --steps 0 --peak-tflops 0
# --log-interval N: the step line every N-th step and the first and the last, the log every
# step; tflops: the model's FLOPs of a step (model.h CFG_MODEL_FLOPS, as Megatron counts them)
# per second and device; --peak-tflops X: mfu = tflops / X, in the line and the log
flops=$(sed -n 's/^#define CFG_MODEL_FLOPS *\([0-9.eE+]*\) .*/\1/p' $S/a/model.h)
if ! $A --init $INIT --data $S/tok.bin --steps 5 --log-interval 2 --peak-tflops 0.5 \
        --log $S/mfu.jsonl > $S/mfu.out 2>&1; then
    show $S/mfu.out 5
    fail log-interval-mfu "the run failed"
elif [ "$(grep -o '^step *[0-9]*' $S/mfu.out | tr -s ' ' | tr '\n' ,)" != \
       "step 1,step 2,step 4,step 5," ] || [ "$(wc -l < $S/mfu.jsonl)" != 5 ]; then
    show $S/mfu.out 8
    fail log-interval-mfu "want the lines of steps 1, 2, 4, 5 on stdout and 5 in the log"
elif ! awk -v flops="$flops" -F'[:,}]' '
        { for (i = 1; i < NF; i++) v[$i] = $(i + 1)
          want = flops / (v["\"ms\""] / 1e3) / 1 / 1e12
          if (want <= 0 || (v["\"tflops\""] - want) / want > 1e-3 ||
              (want - v["\"tflops\""]) / want > 1e-3 ||
              v["\"mfu\""] - v["\"tflops\""] / 0.5 > 6e-5 ||
              v["\"tflops\""] / 0.5 - v["\"mfu\""] > 6e-5) bad = 1 }
        END { exit bad || NR != 5 || flops == "" }' $S/mfu.jsonl ||
     ! grep -q '^step     1/5 .* TFLOP/s | MFU ' $S/mfu.out; then
    head -n 2 $S/mfu.jsonl | sed 's/^/  /'
    fail log-interval-mfu "tflops is not CFG_MODEL_FLOPS ($flops) / ms, or mfu not tflops / 0.5"
else
    pass log-interval-mfu
fi
# memory in the log: mem_mib is the device memory the run printed as planned (and allocated) at
# start, in MiB to 0.1; its peak the same on the CPU (nothing is allocated after the setup);
# rss_mib the host's resident memory, at least what the run touched
planned=$(sed -n 's/^memory: planned \([0-9]*\) bytes.*/\1/p' $S/mfu.out)
if ! awk -v p="$planned" -F'[:,}]' '
        { for (i = 1; i < NF; i++) v[$i] = $(i + 1)
          want = sprintf("%.1f", p / 1048576)
          if (v["\"mem_mib\""] != want || v["\"mem_peak_mib\""] != want ||
              v["\"rss_mib\""] + 0 < 1) bad = 1 }
        END { exit bad || NR != 5 || p == "" }' $S/mfu.jsonl ||
     ! grep -q "^step     1/5 .* | mem $(awk -v p="$planned" 'BEGIN { printf "%.1f", p / 1048576 }') MiB$" \
        $S/mfu.out; then
    head -n 2 $S/mfu.jsonl | sed 's/^/  /'
    fail log-memory "mem_mib / mem_peak_mib are not the planned $planned bytes in MiB, or no rss_mib"
else
    pass log-memory
fi
# README.md's table of training flags is what the flags' table (LIB_FLAGS, lib/flags.h)
# prints, as `make readme-flags` writes it; the usage and the parser come from the same table
readme_flags() {
    make -s --no-print-directory build/lib/flags_doc && build/lib/flags_doc > $S/flags.md &&
    sed -n '/^<!-- train-flags/,/^<!-- end of train-flags/p' README.md | sed '1d;$d' |
        diff $S/flags.md -
}
verdict readme-flags "README.md's table of training flags differs from LIB_FLAGS' (run make \
readme-flags)" $S/v-readme.log readme_flags

# -- (h) the tokenizer and make data ------------------------------------------------------------
TOK=build/tools/tokenize
awk 'BEGIN { for (i = 0; i < 256; i++) printf "%c", i; printf "\nsome text\n" }' > $S/bytes.txt
printf 'a second file\n' > $S/second.txt
cat $S/bytes.txt $S/second.txt > $S/both.txt
tokenize_roundtrip() {      # every byte value, two files concatenated
    [ "$(wc -c < $S/bytes.txt)" -eq 267 ] || { echo "the fixture lost bytes (awk %c)"; return 1; }
    $TOK -o $S/bytes.bin $S/bytes.txt $S/second.txt &&
    [ "$(wc -c < $S/bytes.bin)" -eq $((2 * 281)) ] &&
    $FIX decode $S/bytes.bin $S/bytes.dec &&
    cmp $S/bytes.dec $S/both.txt
}
verdict tokenize-roundtrip "byte tokens do not decode to the input files" $S/tok1.log \
    tokenize_roundtrip
tokenize_llmc() {
    $TOK --llmc -o $S/bytes_shard.bin $S/bytes.txt $S/second.txt &&
    [ "$(od -An -tu4 -N12 $S/bytes_shard.bin | tr -s ' ' | sed 's/^ //')" = "20240520 1 281" ] &&
    tail -c +1025 $S/bytes_shard.bin | cmp - $S/bytes.bin
}
verdict tokenize-llmc "--llmc does not write the header 20240520, 1, count and the same tokens" \
    $S/tok2.log tokenize_llmc
tokenize_missing() {
    $TOK -o $S/x.bin $S/none.txt 2> $S/tok3.err
    rc=$?
    cat $S/tok3.err
    [ "$(cat $S/tok3.err)" = "tokenize: error: cannot open '$S/none.txt': No such file or \
directory" ] && [ $rc = 1 ] && [ ! -e $S/x.bin ]
}
verdict tokenize-missing-input "want status 1, the message, and no output file" $S/tok3.log \
    tokenize_missing
tokenize_usage() { $TOK $S/bytes.txt; [ $? = 2 ]; }
verdict tokenize-usage "no -o: the status is not 2" $S/tok4.log tokenize_usage

FORTUNES=/usr/share/games/fortunes
make_data() {
    make -s --no-print-directory data && [ -s data/corpus.bin ] || return 1
    # the corpus is the fortune files (not the .dat/.u8 indexes) in C-locale order, as bytes
    LC_ALL=C ls -d $FORTUNES/* | grep -v -E '\.(dat|u8)$' | while read -r f; do
        [ -f "$f" ] && cat "$f"
    done > $S/fortunes.txt
    $FIX decode data/corpus.bin $S/corpus.txt &&
    cmp $S/corpus.txt $S/fortunes.txt &&
    $A --data data/corpus.bin --steps 2 --quiet
}
if [ ! -d $FORTUNES ]; then
    skip make-data "$FORTUNES missing (make deps installs fortunes)"
else
    verdict make-data "data/corpus.bin is not the fortunes as byte tokens (stale? remove it)" \
        $S/make-data.log make_data
fi

# -- Generated code: deterministic, and warning-free under the project's flags -------------------
deterministic() {
    for m in "tiny --mbs 4 --nmb 2" "gpt2_124m"; do
        rm -rf $S/det1 $S/det2
        # shellcheck disable=SC2086 # $m is words
        build/gen $m --out $S/det1 && build/gen $m --out $S/det2 && diff -r $S/det1 $S/det2 ||
            return 1
    done
}
verdict gen-deterministic "two runs of build/gen differ (or failed)" $S/det.log deterministic
# build.mk compiles with -Wall -Wextra -Werror; the house flags add -Wshadow,
# -Wstrict-prototypes and -Wmissing-prototypes (docs/DESIGN.md §2).
WARN="-std=c11 -O2 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Werror"
warnings() {
    ok=0
    for f in $S/a/*.c; do
        ${MPICC:-mpicc} $WARN -Iruntime -Ilib -I$S/a -c -o /dev/null "$f" || ok=1
    done
    return $ok
}
verdict gen-warnings "generated C is not warning-free under $WARN" $S/warn.log warnings

# -- (i) GPT-2 124M: CPU and CUDA programs generate and build -----------------------------------
G=$S/gpt2_124m
MKG="make -s --no-print-directory -j2 GEN_DIR=$G GEN_OBJ=$S/obj/gpt2_124m"
gpt2_cpu() { build/gen gpt2_124m --out $G && $MKG $G/train; }
verdict gpt2_124m-build "build/gen gpt2_124m or its CPU program's build failed" $G.log gpt2_cpu
gpt2_cuda() { $MKG $G/train_cuda && [ -x $G/train_cuda ]; }
if ! make -s --no-print-directory echo 2>/dev/null | grep -q '^nvcc: found'; then
    skip gpt2_124m-cuda-build "nvcc not found"
elif ! make -s --no-print-directory echo 2>/dev/null | grep -q 'cuda backend enabled'; then
    skip gpt2_124m-cuda-build "nvcc found but cuBLAS or NCCL missing: no CUDA backend to link"
else
    verdict gpt2_124m-cuda-build "nvcc is here but train_cuda does not compile or link" \
        $G.cuda.log gpt2_cuda
fi

# -- CUDA: the tiny run (a) on a GPU, against the reference (f32: the same tolerances) ----------
cuda_vs_ref() {
    make -s --no-print-directory GEN_DIR=$S/a GEN_OBJ=$S/obj/a $S/a/train_cuda &&
    $S/a/train_cuda --init $INIT --data $S/tok.bin $HP --log $S/a-cuda.jsonl \
        --save $S/a-cuda.safetensors --quiet &&
    $LOGCMP $S/a-cuda.jsonl $S/ref-a.jsonl $TOL &&
    $STC -q $WTOL $S/a-cuda.safetensors $S/ref-a.safetensors
}
if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    skip cuda-vs-ref "no GPU (nvidia-smi -L lists none)"
else
    verdict cuda-vs-ref "the CUDA program's run differs from the reference (or failed)" \
        $S/a-cuda.log cuda_vs_ref
fi

finish
