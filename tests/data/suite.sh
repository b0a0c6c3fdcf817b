#!/bin/bash
# tests/data/suite.sh: Megatron indexed datasets (lib/data.c): the training program's
# `--dump-samples K` against an independent NumPy implementation of Megatron's GPTDataset and
# BlendedDataset sampling (tests/data/megatron_ref.py, NumPy's own RandomState) on corpora the
# test writes (uint16, int32 up to 2^31, uint8, int16, int64; one, several and many epochs,
# the last apart or not; weighted and unweighted blends), compared exactly; a training run on a
# blend (one rank against two data-parallel ranks: the same losses); and every bad-file
# message. The corpora need python3; the sampling tests need NumPy (python3-numpy, `make deps`)
# and SKIP without it. Prints PASS/FAIL/SKIP data/<name> (tests/lib.sh); scratch in
# build/test/data/.
#
# Tolerance: dp2 x 2 micro-batches, and cp2, against dp1 (the same global batch of 4 samples):
# 1e-5 relative on loss and grad_norm (only the f32 summation order differs; observed < 1e-6),
# lr exact.
. "$(dirname "$0")/../lib.sh" data
REFPY=tests/data/megatron_ref.py

show() { sed 's/^/  /' "$1" | head -n "${2:-20}"; }

# -- Setup --------------------------------------------------------------------------------------
if ! make -s --no-print-directory build/gen build/librt_cpu.a build/libgpt_cpu.a \
        > $S/make.log 2>&1; then
    show $S/make.log
    fail setup "make build/gen librt_cpu.a libgpt_cpu.a failed"
    finish
fi
# PY writes the corpora (any Python 3); NPY, the first Python with NumPy, samples them
PY="" NPY=""
for p in python3 /usr/bin/python3; do
    command -v $p > /dev/null 2>&1 && $p -c 'import struct' > /dev/null 2>&1 || continue
    [ -z "$PY" ] && PY=$p
    if [ -z "$NPY" ] && $p -c 'import numpy' > /dev/null 2>&1; then NPY=$p; fi
done
# tiny: sequence 64, vocabulary 256; MBS 4 (GBS 4), DP 2 with 2 micro-batches of 1 (GBS 4:
# rank d's micro-batch k is sample 2k + d of the step, as Megatron's sampler hands them out), and
# CP 2 with MBS 4 (each rank its two chunks of every sample's positions)
for b in "dp1 tiny --mbs 4" "dp2 tiny --mbs 1 --nmb 2 --dp 2" "cp2 tiny --mbs 4 --cp 2"; do
    set -- $b
    name=$1
    shift
    if ! gen_build $S/$name "$@"; then
        fail setup "$WHY"
        finish
    fi
done
TRAIN=$S/dp1/train
GBS=4

# corpus PREFIX ARGS...: write a corpus with megatron_ref.py
corpus() {
    if ! $PY $REFPY write "$@" > $S/write.log 2>&1; then
        show $S/write.log
        fail setup "megatron_ref.py write $* failed"
        finish
    fi
}

# -- Sampling: train --dump-samples against the NumPy implementation ---------------------------
# same NAME STEPS WORDS... [-- TRAIN-FLAGS...]: the first STEPS*GBS samples of both, exactly
same() {
    local name=$1 steps=$2 seed=1234
    shift 2
    local words=() flags=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do words+=("$1"); shift; done
    [ "$1" = "--" ] && shift
    flags=("$@")
    [ "${flags[0]}" = "--data-seed" ] && seed=${flags[1]}
    local k=$((steps * GBS))
    local data=(--data-path "${words[@]}")
    [ ${#words[@]} = 1 ] && data=(--data "${words[0]}")
    if ! run_prog $TRAIN 1 $S/$name.log --steps $steps --dump-samples $k "${data[@]}" \
            "${flags[@]}"; then
        show $S/$name.log
        fail "$name" "train --dump-samples $k failed: $(first_error $S/$name.log)"
        return
    fi
    grep '^sample ' $S/$name.log > $S/$name.c.txt
    local w=("${words[@]}")
    [ ${#w[@]} = 1 ] && w=("${w[0]%.bin}")
    if ! $NPY $REFPY sample --seq 64 --samples $k --seed $seed --dump $k "${w[@]}" \
            > $S/$name.py.txt 2> $S/$name.py.err; then
        show $S/$name.py.err
        fail "$name" "megatron_ref.py sample failed"
        return
    fi
    if cmp -s $S/$name.c.txt $S/$name.py.txt && [ $(wc -l < $S/$name.py.txt) = $k ]; then
        pass "$name"
    else
        diff $S/$name.c.txt $S/$name.py.txt | head -n 6 | cut -c1-160 | sed 's/^/  /'
        fail "$name" "the samples differ from NumPy's (first differences above)"
    fi
}

if [ -z "$PY" ]; then
    skip sampling "python3 not found: no corpus writer"
elif [ -z "$NPY" ]; then
    skip sampling "NumPy not found (python3-numpy: make deps): cannot check the sampling"
else
    C=$S/c
    mkdir -p $C
    # a: ~16k uint16 tokens (~250 samples an epoch); b: ~3k int32 ids up to 2^31; c: uint8;
    # d: int64; small: 5 documents (many epochs)
    corpus $C/a --dtype uint16 --docs 240 --seed 1 --max-id 65535
    corpus $C/b --dtype int32 --docs 50 --seed 2 --max-id 2147483647
    corpus $C/c --dtype uint8 --docs 40 --seed 3 --max-id 256 --max-len 60
    corpus $C/d --dtype int64 --docs 30 --seed 4 --max-id 100000
    corpus $C/small --dtype int16 --docs 5 --seed 5 --max-id 30000 --max-len 30
    same one-epoch 40 $C/a
    same epochs-last-apart 70 $C/a                 # 280 samples: the second epoch apart
    same epochs-together 120 $C/a                  # 480: the last epoch nearly full
    same int32 30 $C/b
    same int32-seed 30 $C/b -- --data-seed 7
    same uint8-int64 25 0.5 $C/c 0.5 $C/d               # weighted blend of two dtypes
    same many-epochs 40 $C/small
    same by-bin-name 10 $C/a.bin
    same blend-0.3-0.7 50 0.3 $C/a 0.7 $C/b
    # nine weights whose blend (240 samples) differs if they are summed in order, or from the
    # first on, rather than pairwise as numpy.sum sums them
    same blend-9 60 0.125 $C/a 0.3 $C/b 0.4 $C/c 0.125 $C/d 0.4 $C/small 0.05 $C/a 0.01 $C/b \
        0.1 $C/c 0.33 $C/d -- --data-seed 99
    same blend-unweighted 30 $C/a $C/b $C/c
fi

# -- --split: the splits' documents and samples against the NumPy implementation --------------
# split NAME SPLIT WHICH STEPS INTERVAL ITERS WORDS...: --dump-split WHICH of --split SPLIT for a
# run of STEPS steps evaluating every INTERVAL steps, ITERS global batches: as many samples as
# Megatron's training.py asks of that split (train: STEPS global batches; valid: ITERS at each
# of STEPS // INTERVAL + 1 evaluations; test: ITERS), all of them, against NumPy's
split() {
    local name=$1 spl=$2 which=$3 steps=$4 interval=$5 iters=$6 k
    shift 6
    local words=("$@") data
    case $which in
        train) k=$((steps * GBS)) ;;
        valid) k=$(((steps / interval + 1) * iters * GBS)) ;;
        test) k=$((iters * GBS)) ;;
    esac
    data=(--data-path "${words[@]}")
    [ ${#words[@]} = 1 ] && data=(--data "${words[0]}")
    if ! run_prog $TRAIN 1 $S/$name.log --steps $steps --split $spl --eval-interval $interval \
            --eval-iters $iters --dump-samples $k --dump-split $which "${data[@]}"; then
        show $S/$name.log
        fail "$name" "train --dump-samples $k --dump-split $which failed: $(first_error $S/$name.log)"
        return
    fi
    grep '^sample ' $S/$name.log > $S/$name.c.txt
    if ! $NPY $REFPY sample --seq 64 --samples $k --seed 1234 --dump $k --split $spl \
            --which $which "${words[@]}" > $S/$name.py.txt 2> $S/$name.py.err; then
        show $S/$name.py.err
        fail "$name" "megatron_ref.py sample --split failed"
        return
    fi
    if cmp -s $S/$name.c.txt $S/$name.py.txt && [ $(wc -l < $S/$name.py.txt) = $k ]; then
        pass "$name"
    else
        diff $S/$name.c.txt $S/$name.py.txt | head -n 6 | cut -c1-160 | sed 's/^/  /'
        fail "$name" "the $which split's samples differ from NumPy's (first differences above)"
    fi
}

# bounds NAME PREFIX SPLIT...: for each split string, the documents of the three splits the
# training program prints ("split: train [lo, hi), valid [lo, hi), test none") against NumPy's
# rounding of Megatron's bounds
bounds() {
    local name=$1 prefix=$2 spl got want n ok=1
    shift 2
    n=$($PY -c "import struct
print(struct.unpack_from('<Q', open('$prefix.idx', 'rb').read(), 18)[0])")
    for spl; do
        run_prog $TRAIN 1 $S/$name.log --steps 1 --split $spl --data $prefix --dump-samples 1
        got=$(sed -n 's/.*; split: \([^;]*\);.*/\1/p' $S/$name.log | head -n 1)
        [ -z "$got" ] && got=$(first_error $S/$name.log)
        want=$($NPY $REFPY bounds $spl $n)
        if [ "$got" != "$want" ]; then
            echo "  --split $spl of $n documents: the program's '$got', NumPy's '$want'"
            ok=0
        fi
    done
    if [ $ok = 1 ]; then pass "$name"; else fail "$name" "the split bounds differ (above)"; fi
}

if [ -z "$NPY" ]; then
    skip split "NumPy not found (python3-numpy: make deps): cannot check the splits"
else
    # five: 5 documents of 195, 79, 1, 35 and 18 tokens; 1,1,2 puts the train/valid bound at
    # 1.25 and the valid/test one at 2.5, which Python's round takes to 2 (half to even)
    corpus $C/five --dtype uint16 --docs 5 --seed 9 --max-id 256 --max-len 100
    bounds split-bounds-small $C/five 1,1,2 3,1,1 1,2,3
    bounds split-bounds $C/a 969,30,1 98,1,1 0.5,0.3,0.2 7,2,1 1,0,1
    split split-train 969,30,1 train 20 5 2 $C/a
    split split-valid 90,8,2 valid 12 3 2 $C/a           # 5 evaluations of 2: 40 samples
    split split-valid-epochs 95,5,0 valid 20 2 3 $C/a    # 11 x 3 x 4 = 132: two epochs
    split split-test 90,5,5 test 10 5 3 $C/a
    split split-valid-blend 90,8,2 valid 12 3 2 0.3 $C/a 0.7 $C/b
    split split-valid-unweighted 80,15,5 valid 4 2 1 $C/a $C/c
fi

# -- Training on an indexed dataset ---------------------------------------------------------------
# v, w: ids < 256 (the model's vocabulary)
T=$S/t
mkdir -p $T
if [ -n "$PY" ]; then
    corpus $T/v --dtype uint16 --docs 300 --seed 11 --max-id 256 --max-len 120
    corpus $T/w --dtype int32 --docs 100 --seed 12 --max-id 256 --max-len 80
else
    T=""
fi
if [ -z "$T" ]; then
    skip train "python3 not found: no corpus writer"
else
    # 8 steps of 4: 32 samples; the blend holds ceil(32 * 0.6) + ceil(32 * 0.4) = 33
    run_prog $S/dp1/train 1 $S/dp1.log --steps 8 --data-path 0.6 $T/v 0.4 $T/w \
        --log $S/dp1.jsonl --data-seed 5
    rc1=$?
    run_prog $S/dp2/train 2 $S/dp2.log --steps 8 --data-path 0.6 $T/v 0.4 $T/w \
        --log $S/dp2.jsonl --data-seed 5
    rc2=$?
    if [ $rc1 != 0 ] || [ $rc2 != 0 ]; then
        show $S/dp1.log
        show $S/dp2.log
        fail train "training on a blend of indexed datasets failed"
    elif [ $(wc -l < $S/dp1.jsonl) != 8 ] ||
         ! grep -q '^data: 33 samples blended, seed 5$' $S/dp1.log; then
        show $S/dp1.log
        fail train "expected 8 log lines and 'data: 33 samples blended, seed 5'"
    elif ! out=$($LOGCMP $S/dp2.jsonl $S/dp1.jsonl loss=1e-5 grad_norm=1e-5 lr=exact 2>&1); then
        echo "$out" | sed 's/^/  /' | head -n 8
        fail train "dp2 and dp1 on the same blend give different losses"
    else
        pass train
    fi
    run_prog $S/cp2/train 2 $S/cp2.log --steps 8 --data-path 0.6 $T/v 0.4 $T/w \
        --log $S/cp2.jsonl --data-seed 5
    if [ $? != 0 ]; then
        show $S/cp2.log
        fail train-cp2 "training on a blend with CP 2 failed"
    elif ! out=$($LOGCMP $S/cp2.jsonl $S/dp1.jsonl loss=1e-5 grad_norm=1e-5 lr=exact 2>&1); then
        echo "$out" | sed 's/^/  /' | head -n 8
        fail train-cp2 "cp2 and dp1 on the same blend give different losses"
    else
        pass train-cp2
    fi
    # another seed consumes other samples: other losses
    run_prog $S/dp1/train 1 $S/seed.log --steps 8 --data-path 0.6 $T/v 0.4 $T/w \
        --log $S/seed.jsonl --data-seed 6
    if $LOGCMP $S/seed.jsonl $S/dp1.jsonl loss=1e-6 > /dev/null 2>&1; then
        fail train-seed "--data-seed 6 trained on the same samples as --data-seed 5"
    else
        pass train-seed
    fi
fi

# -- Bad files: one clear message, before the first step ------------------------------------------
# bad NAME "ARGS" TEXT...: train --steps 2 ARGS (split into words) must exit non-zero, run no
# step, and print first the TEXTs joined (a message cut into pieces to keep lines short)
bad() {
    local name=$1 args=$2 expect line rc
    shift 2
    printf -v expect '%s' "$@"
    run_prog $TRAIN 1 $S/$name.log --steps 2 $args
    rc=$?
    line=$(head -n 1 $S/$name.log)
    if [ $rc = 0 ] || [ "$line" != "$expect" ] || grep -q '^step ' $S/$name.log; then
        show $S/$name.log 5
        fail "bad-$name" "expected a failure with: $expect"
    else
        pass "bad-$name"
    fi
}
if [ -z "$T" ]; then
    skip bad-files "python3 not found: no corpus writer"
else
    B=$S/bad
    mkdir -p $B
    # copy NAME: a fresh copy of the good corpus v as $B/NAME; poke NAME.EXT OFFSET BYTES
    copy() { cp $T/v.bin $B/$1.bin && cp $T/v.idx $B/$1.idx; }
    poke() { printf "$3" | dd of=$B/$1 bs=1 seek=$2 conv=notrunc status=none; }
    copy magic && poke magic.idx 0 XXIDIDX
    bad magic "--data $B/magic" "$B/magic.idx: error: bad magic: not a Megatron index " \
        '(expected the bytes "MMIDIDX\x00\x00" that tools/preprocess_data.py writes)'
    copy version && poke version.idx 9 '\002'
    bad version "--data $B/version" \
        "$B/version.idx: error: index version 2; only version 1 is supported"
    copy float && poke float.idx 17 '\007'
    bad float "--data $B/float" "$B/float.idx: error: dtype code 7 (float32): token ids " \
        "need an integer dtype (codes 1-5 and 8)"
    copy idx && truncate -s 1000 $B/idx.idx
    bad truncated-idx "--data $B/idx" "$B/idx.idx: error: truncated: the header announces " \
        "300 sequences and 301 documents (6042 bytes), the file has 1000"
    size=$(stat -c %s $T/v.bin)
    copy bin && truncate -s $((size - 2)) $B/bin.bin
    lens="import struct; l = struct.unpack_from('<300i', open('$T/v.idx', 'rb').read(), 34)"
    last=$($PY -c "$lens; print(l[-1])")
    bad truncated-bin "--data $B/bin" "$B/bin.bin: error: truncated: sequence 299 ($last " \
        "uint16 tokens at byte $((size - 2 * last))) ends at byte $size, the file has " \
        "$((size - 2)) bytes"
    copy vocab && poke vocab.bin 20 '\001\001'
    # the token at byte 20 is token 10 of the corpus: its sequence and position there
    set -- $($PY -c "$lens
s, p = 0, 10
while p >= l[s]: p, s = p - l[s], s + 1
print(s, p)")
    bad vocab "--data $B/vocab" "$B/vocab.bin: error: token 257 at position $2 of sequence " \
        "$1 is out of range: the model's vocabulary has 256 ids (0..255); was the dataset " \
        "made for another tokenizer?"
    cp $T/v.idx $B/nobin.idx
    bad no-bin "--data $B/nobin" "$B/nobin.bin: error: cannot open: No such file or directory"
    bad weights "--data-path 0.5 $T/v $T/w $T/v" \
        "train: error: --data-path: give a weight before every prefix or none"
    bad weight-inf "--data-path inf $T/v 1 $T/w" \
        "train: error: --data-path: weight inf of $T/v must be a finite number > 0"
    bad weight-sum "--data-path 1e308 $T/v 1e308 $T/w" \
        "train: error: --data-path: the weights sum to more than the largest double " \
        "(1.79769e+308; the largest weight is 1e+308 of $T/v): scale them down"
fi
finish
