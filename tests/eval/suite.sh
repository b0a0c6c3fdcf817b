#!/bin/bash
# tests/eval/suite.sh: validation as Megatron does it (--split, --eval-interval, --eval-iters;
# README.md, "Validation"), end to end on the CPU:
#  * every layout of tests/eval/layouts.txt (PP, PP with VP, TP x DP with SP, the distributed
#    optimizer, CP, MoE with EP and PP) evaluates as the single-rank program does: the same
#    eval_loss (and losses, norms, weights) within the table's tolerances;
#  * an evaluation changes nothing of the training: the steps' losses and norms and the saved
#    weights are bit-identical with and without --eval-interval (tiny; MoE with the expert
#    bias, whose counts the forwards also make);
#  * the evaluations come after every --eval-interval-th step and once more at the end (the
#    final one), each from the valid split's next samples; a resumed run goes on with the
#    samples the first run would have read;
#  * the evaluations' scalars in the TensorBoard event file, read by tests/train/tb_read.py;
#  * the final evaluation's eval_loss is the double-precision reference's (tests/ref gpt2_ref)
#    mean loss on the same samples (the valid split's, as --dump-split valid prints them) with
#    the run's final weights;
#  * the errors: --eval-interval without --split, bad --split strings, --eval-iters 0, a valid
#    split of no share, --split on a token file, --dump-split misuse;
#  * tests/eval/gpu.txt: train_cuda evaluates as the CPU does, on a GPU (built only without
#    one) and on the CPU emulation of CUDA.
# The valid split's sample order itself is checked against NumPy in tests/data. Protocol:
# tests/lib.sh; scratch in build/test/eval/.
. "$(dirname "$0")/../lib.sh" eval
PY=python3
command -v $PY > /dev/null 2>&1 || PY=/usr/bin/python3

show() { sed 's/^/  /' "$1" | head -n "${2:-20}"; }

if ! make -s all ref > "$S/make.txt" 2>&1; then
    show "$S/make.txt"
    fail build "make all ref failed"
    finish
fi
if ! command -v $PY > /dev/null 2>&1; then
    skip all "python3 not found: no corpus writer (tests/data/megatron_ref.py)"
    finish
fi

# -- Data and initial weights -----------------------------------------------------------------
# v: 300 documents of up to 120 ids < 256 (the train split 270 of them, valid 24, test 6)
$PY tests/data/megatron_ref.py write "$S/v" --dtype uint16 --docs 300 --seed 11 --max-id 256 \
    --max-len 120 || exit 2
build/ref/gpt2_ref --layers 8 --hidden 64 --heads 4 --seq 64 --vocab 256 --random-init 5 \
    --save-init "$S/init.safetensors" > /dev/null || exit 2
build/ref/make_tokens --vocab 256 --tokens 2000 --seed 3 "$S/tokens.bin" > /dev/null || exit 2

equiv tests/eval/layouts.txt

# the step lines of a log, timings removed
steps_of() { grep -v '"eval_loss"' "$1" | sed 's/,"ms".*//'; }

# -- The evaluations: when, and the final one -------------------------------------------------
B=$S/run/base
if [ ! -s $B.jsonl ]; then
    fail final "the base row did not run"
else
    got=$(grep '"eval_loss"' $B.jsonl | sed 's/,"eval_loss".*"final":true}/ final/;
                                           s/,"eval_loss".*//; s/{"step"://' | tr '\n' ' ')
    if [ "$got" != "2 4 4 final " ]; then
        fail final "expected evaluations after steps 2 and 4 and a final one; the log's: '$got'"
    else
        pass final
    fi
fi

# -- An evaluation changes nothing of the training ---------------------------------------------
# unchanged NAME ROW ARGS...: ROW's program without --eval-interval: the same step lines and
# weights, bit for bit
unchanged() {
    local name=$1 row=$2
    shift 2
    local prog=${DIR[$row]}/train out=$S/run/$name
    if [ ! -s $S/run/$row.jsonl ]; then
        fail "$name" "the $row row did not run"
        return
    fi
    run_prog $prog ${WORLD[$row]} $out.log "$@" --log $out.jsonl --save $out.safetensors
    if [ $? != 0 ]; then
        show $out.log
        fail "$name" "the run without --eval-interval failed: $(first_error $out.log)"
    elif ! cmp -s <(steps_of $out.jsonl) <(steps_of $S/run/$row.jsonl); then
        diff <(steps_of $out.jsonl) <(steps_of $S/run/$row.jsonl) | head -n 4 | sed 's/^/  /'
        fail "$name" "the steps differ with and without evaluations"
    elif ! cmp -s $out.safetensors $S/run/$row.safetensors; then
        fail "$name" "the saved weights differ with and without evaluations"
    else
        pass "$name"
    fi
}
unchanged unchanged base --init $S/init.safetensors --data $S/v --split 90,8,2 --steps 4
unchanged unchanged-moe moe-dp2-ep2 --data $S/v --split 90,8,2 --steps 4 --seed 3

# -- A resumed run's evaluations go on with the valid split's next samples ------------------------
R=$S/resume
rm -rf $R.ckpt
run_prog ${DIR[base]}/train 1 $R.1.log --init $S/init.safetensors --data $S/v --split 90,8,2 \
    --steps 4 --eval-interval 2 --eval-iters 2 --ckpt-dir $R.ckpt --exit-interval 2 \
    --log $R.jsonl
rc1=$?
run_prog ${DIR[base]}/train 1 $R.2.log --init $S/init.safetensors --data $S/v --split 90,8,2 \
    --steps 4 --eval-interval 2 --eval-iters 2 --ckpt-dir $R.ckpt --resume --log $R.jsonl
rc2=$?
if [ $rc1 != 0 ] || [ $rc2 != 0 ]; then
    show $R.1.log
    show $R.2.log
    fail resume "the stopped or the resumed run failed"
elif ! grep -q '^eval      4/4 | eval_loss .* | final$' $R.2.log; then
    show $R.2.log
    fail resume "the resumed run printed no final evaluation ('eval 4/4 | ... | final')"
elif ! cmp -s <(sed 's/,"ms".*//; s/,"eval_ms".*//' $R.jsonl) \
              <(sed 's/,"ms".*//; s/,"eval_ms".*//' $B.jsonl); then
    diff <(sed 's/,"ms".*//; s/,"eval_ms".*//' $R.jsonl) \
         <(sed 's/,"ms".*//; s/,"eval_ms".*//' $B.jsonl) | head -n 4 | sed 's/^/  /'
    fail resume "stopped at step 2 and resumed, the run's log differs from the whole run's"
else
    pass resume
fi

# -- The evaluations in the event file --------------------------------------------------------------
# (tests/train/tb_read.py reads it independently): Megatron's tags, the --log file's values
T=$S/tb
rm -rf $T
run_prog ${DIR[base]}/train 1 $T.log --init $S/init.safetensors --data $S/v --split 90,8,2 \
    --steps 2 --eval-interval 2 --eval-iters 1 --tensorboard-dir $T --log $T.jsonl --quiet
if [ $? != 0 ] || ! $PY tests/train/tb_read.py $T/events.out.tfevents.* > $T.txt 2>&1; then
    show $T.log
    show $T.txt
    fail tensorboard "the run with --tensorboard-dir failed, or tb_read.py refused its file"
else
    got=$(grep ' lm loss validation' $T.txt | awk '{ print $1, $NF }' | tr '\n' ' ')
    want=$(grep '"eval_loss"' $T.jsonl | sed 's/{"step":\([0-9]*\),"eval_loss":\([^,]*\),"eval_ppl":\([^,]*\),.*/\1 \2 \1 \3/' |
           tr '\n' ' ')
    if ! awk -v g="$got" -v w="$want" 'BEGIN { n = split(g, a, " "); m = split(w, b, " ")
            if (n != 8 || m != 8) exit 1
            for (i = 1; i <= n; i++) { d = a[i] - b[i]; if (d < 0) d = -d
                                       if (d > 1e-6 * (b[i] < 0 ? -b[i] : b[i])) exit 1 }
            exit 0 }'; then
        fail tensorboard "the event file's 'lm loss validation' and its ppl ($got) are not " \
            "the log's eval_loss and eval_ppl ($want)"
    else
        pass tensorboard
    fi
fi

# -- The final evaluation against the double-precision reference ---------------------------------
# The base row's final evaluation reads global batches 4 and 5 of the valid split (2 per
# evaluation, after steps 2 and 4): its samples 16..23. The reference's loss of one step at
# learning rate 0 from the final weights on a 65-token file holding one sample is that
# sample's mean token loss; the evaluation's is the mean over the 8 samples' tokens.
X=$S/ref
mkdir -p $X
run_prog ${DIR[base]}/train 1 $X/dump.log --data $S/v --split 90,8,2 --steps 4 \
    --eval-interval 2 --eval-iters 2 --dump-samples 24 --dump-split valid
if [ $? != 0 ] || [ ! -s $B.safetensors ]; then
    show $X/dump.log
    fail reference "--dump-samples 24 --dump-split valid failed (or no base row)"
else
    grep '^sample ' $X/dump.log | sed -n '17,24p' | $PY -c '
import struct, sys
for k, line in enumerate(sys.stdin):
    ids = [int(t) for t in line.split(":")[1].split()]
    open("%s/s%d.bin" % (sys.argv[1], k), "wb").write(struct.pack("<%dH" % len(ids), *ids))
' "$X"
    sum=0 ok=1
    for k in 0 1 2 3 4 5 6 7; do
        build/ref/gpt2_ref --layers 8 --hidden 64 --heads 4 --seq 64 --vocab 256 \
            --init $B.safetensors --data $X/s$k.bin --steps 1 --lr 0 --mbs 1 --nmb 1 \
            --log $X/r$k.jsonl > $X/r$k.log 2>&1 || ok=0
    done
    want=$(cat $X/r?.jsonl | sed 's/.*"loss":\([^,]*\),.*/\1/' | awk '{ s += $1 } END {
        if (NR == 8) printf "%.9g", s / 8 }')
    got=$(tail -n 1 $B.jsonl | sed 's/.*"eval_loss":\([^,]*\),.*/\1/')
    if [ $ok = 0 ] || [ -z "$want" ]; then
        show $X/r0.log
        fail reference "gpt2_ref failed on the final evaluation's samples"
    elif ! awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d
                                                exit !(d <= 1e-5 * b) }'; then
        fail reference "the final eval_loss $got, the reference's mean loss $want (tolerance " \
            "1e-5 relative: f32 against f64)"
    else
        pass reference
    fi
fi

# -- Errors: one clear line, nothing run -------------------------------------------------------------
# bad NAME "ARGS" TEXT...: the base program with ARGS must exit 2 with the line TEXT (joined)
bad() {
    local name=$1 args=$2 expect line rc
    shift 2
    printf -v expect '%s' "$@"
    # shellcheck disable=SC2086 # ARGS: words
    run_prog ${DIR[base]}/train 1 $S/bad-$name.log --steps 2 $args
    rc=$?
    line=$(grep -m 1 'error' $S/bad-$name.log)
    if [ $rc != 2 ] || [ "$line" != "$expect" ] || grep -q '^step ' $S/bad-$name.log; then
        show $S/bad-$name.log 5
        fail "bad-$name" "expected exit 2 and: $expect"
    else
        pass "bad-$name"
    fi
}
D="--data $S/v"
bad no-split "$D --eval-interval 2" "train: error: --eval-interval evaluates on the valid " \
    "split: it needs --split A,B,C (e.g. --split 969,30,1) and a Megatron dataset"
bad split-two "$D --split 1,2" "train: error: --split '1,2': expected three numbers " \
    "separated by commas (train,valid,test), e.g. 969,30,1 (Megatron reads 99,1 as 99,1,0: " \
    "write the zero)"
bad split-words "$D --split a,b,c" \
    "train: error: --split 'a,b,c': expected three numbers, e.g. 969,30,1"
bad split-zero "$D --split 0,0,0" "train: error: --split '0,0,0': all three shares are zero"
bad split-negative "$D --split 1,-1,0" "train: error: --split '1,-1,0': a share is negative"
bad eval-iters "$D --split 9,1,0 --eval-interval 2 --eval-iters 0" \
    "train: error: --eval-iters must be >= 1 (the global batches of one evaluation), got 0"
bad no-valid "$D --split 1,0,0 --eval-interval 2" \
    "train: error: --split: the valid split has a share of zero"
bad token-file "--data $S/tokens.bin --split 9,1,0" "train: error: --split divides the " \
    "documents of a Megatron dataset (--data PREFIX, --data-path); $S/tokens.bin is a token file"
bad dump-split "$D --dump-samples 2 --dump-split valid" \
    "train: error: --dump-split valid needs --split A,B,C"
bad dump-split-name "$D --split 9,1,0 --dump-samples 2 --dump-split dev" \
    "train: error: --dump-split must be train, valid or test, got 'dev'"

# -- CUDA: the evaluation on train_cuda, on a GPU (built only without one) and on the CPU
# emulation of CUDA (every machine) ----------------------------------------------------------------
equiv tests/eval/gpu.txt --cuda
equiv tests/eval/gpu.txt --emu
finish
