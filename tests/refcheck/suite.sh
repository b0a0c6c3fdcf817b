#!/bin/bash
# tests/refcheck/suite.sh: the reference's own tests (tests/ref, build/ref/gpt2_ref), so that the
# oracle the generated programs are judged by is itself right: gradients against finite
# differences, AdamW/LR/clipping against hand-computed values, file formats, batching, error
# messages, and (when PyTorch is installed) whole training runs against torch in float64.
# Protocol: tests/lib.sh. Run: make test SUITE=refcheck.
. "$(dirname "$0")/../lib.sh" refcheck
D=$S
REF=build/ref/gpt2_ref
TOK=build/ref/make_tokens
UNIT=build/ref/ref_test

if ! make -s ref > "$D/build.txt" 2>&1; then
    head -n 20 "$D/build.txt"
    fail build "make ref failed"
    finish
fi
pass build

# -- Unit checks inside build/ref/ref_test (see tests/ref/ref_test.c for each bound) ----------

for t in gradcheck adamw lr clip init accum st-roundtrip st-dtypes batch \
         moe-gradcheck moe-routing moe-capacity moe-dense moe-layout \
         llama-ops llama-gradcheck llama-layout llama-moe-dense; do
    if "$UNIT" "$t" "$D" > "$D/$t.txt" 2>&1; then
        pass "$t"
    else
        head -n 15 "$D/$t.txt"
        fail "$t" "$(tail -n 1 "$D/$t.txt")"
    fi
done

# -- Helpers for the command-line tests -------------------------------------------------------

# field NAME FILE.jsonl: the values of one key, one per line
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" "$2"; }

# same_values FILE_A FILE_B RTOL: every line's number agrees within RTOL (relative)
same_values() {
    paste "$1" "$2" | awk -v tol="$3" '
        { d = $1 - $2; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2
          if (NF != 2 || d > tol * s) { bad = 1; print "  line " NR ": " $1 " vs " $2 } }
        END { exit bad }'
}

# run_ok NAME CMD...: run a reference command that must succeed; output in $D/NAME.out
run_ok() {
    name=$1; shift
    if ! "$@" > "$D/$name.out" 2> "$D/$name.err"; then
        fail "$name" "command failed: $(head -n 1 "$D/$name.err")"
        return 1
    fi
}

# losses_agree NAME TAG "M:N:P ..." CMD...: runs CMD --mbs M --nmb N --dp P with its log in
# $D/TAG_M_N_P.jsonl for each split of the same global batch; every step's loss must agree with
# the first split's to 1e-12. Fails NAME and returns 1 at the first split that does not run or
# does not agree; passes nothing (the caller may check more).
losses_agree() {
    local test=$1 tag=$2 splits=$3 split mbs nmb dp log base="" base_split=""
    shift 3
    for split in $splits; do
        IFS=: read -r mbs nmb dp <<< "$split"
        log="$D/${tag}_${mbs}_${nmb}_${dp}"
        run_ok "$test" "$@" --mbs "$mbs" --nmb "$nmb" --dp "$dp" --log "$log.jsonl" || return 1
        field loss "$log.jsonl" > "$log.loss"
        if [ -z "$base" ]; then
            base=$log base_split="mbs $mbs nmb $nmb dp $dp"
        elif ! same_values "$log.loss" "$base.loss" 1e-12; then
            fail "$test" "mbs $mbs nmb $nmb dp $dp differs from $base_split"
            return 1
        fi
    done
}

TINY="--layers 2 --hidden 32 --heads 4 --seq 32 --vocab 64"
"$TOK" --vocab 64 --tokens 20000 --period 13 --seed 5 "$D/syn64.bin" || exit 2
"$TOK" --vocab 64 --tokens 20000 --period 13 --seed 5 --shard "$D/syn64_shard.bin" || exit 2

# -- Training ---------------------------------------------------------------------------------

# The loss falls: 30 steps on a pattern with period 13 and 10% noise.
if run_ok loss-falls $REF $TINY --random-init 1 --data "$D/syn64.bin" --steps 30 --mbs 4 \
        --lr 3e-3 --warmup 3 --log "$D/falls.jsonl"; then
    first=$(field loss "$D/falls.jsonl" | head -n 1)
    last=$(field loss "$D/falls.jsonl" | tail -n 1)
    if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }'; then
        pass loss-falls
    else
        fail loss-falls "loss went from $first to $last in 30 steps (want a drop > 1.0)"
    fi
fi

# Gradient accumulation and data parallelism split the same global batch of 4 sequences:
# losses of every step agree to 1e-12 (exactly up to rounding in double).
if losses_agree accum-cli acc "4:1:1 1:4:1 2:2:1 1:2:2 2:1:2 1:1:4" \
        $REF $TINY --random-init 2 --data "$D/syn64.bin" --steps 5 --lr 1e-2; then
    pass accum-cli
fi

# A token file and an llm.c shard with the same tokens train identically (byte-equal logs).
if run_ok shard-same $REF $TINY --random-init 3 --data "$D/syn64.bin" --steps 3 --mbs 2 \
        --log "$D/raw.jsonl" &&
   run_ok shard-same $REF $TINY --random-init 3 --data "$D/syn64_shard.bin" --steps 3 --mbs 2 \
        --log "$D/shard.jsonl"; then
    if cmp -s "$D/raw.jsonl" "$D/shard.jsonl" && grep -q 'llm.c shard' "$D/shard-same.out"
    then
        pass shard-same
    else
        fail shard-same "the shard's log differs from the raw file's, or it was not recognised"
    fi
fi

# Default schedule: min_lr = lr/10, no warm-up, cosine over --steps, step t at the rate for
# t - 1 completed steps (Megatron's), so min_lr would be the rate of step steps + 1.
# With 3 steps: 6e-5 + 2.7e-4 (1 + cos((t - 1) pi/3)) = 6e-4, 4.65e-4, 1.95e-4.
if run_ok lr-defaults $REF $TINY --random-init 1 --data "$D/syn64.bin" --steps 3 \
        --log "$D/lr.jsonl"; then
    field lr "$D/lr.jsonl" > "$D/lr.got"
    printf '6e-4\n4.65e-4\n1.95e-4\n' > "$D/lr.want"
    if same_values "$D/lr.got" "$D/lr.want" 1e-12 > "$D/lr.diff"; then
        pass lr-defaults
    else
        cat "$D/lr.diff"
        fail lr-defaults "the default schedule is not lr 6e-4 -> 6e-5 cosine over --steps"
    fi
fi

# Clipping: the reported grad norm is the one before clipping, so step 1 is the same with and
# without it; a tiny --clip changes the update and so the loss of step 2.
if run_ok clip-cli $REF $TINY --random-init 1 --data "$D/syn64.bin" --steps 2 --lr 1e-2 \
        --clip 0 --log "$D/noclip.jsonl" &&
   run_ok clip-cli $REF $TINY --random-init 1 --data "$D/syn64.bin" --steps 2 --lr 1e-2 \
        --clip 1e-3 --log "$D/clip.jsonl"; then
    if [ "$(head -n 1 "$D/noclip.jsonl")" != "$(head -n 1 "$D/clip.jsonl")" ]; then
        fail clip-cli "step 1 differs between --clip 0 and --clip 1e-3"
    elif [ "$(sed -n 2p "$D/noclip.jsonl")" = "$(sed -n 2p "$D/clip.jsonl")" ]; then
        fail clip-cli "--clip 1e-3 did not change step 2"
    else
        pass clip-cli
    fi
fi

# Log format: one object per step with exactly these keys in this order.
num='-\{0,1\}[0-9][0-9.e+-]*'
line="^{\"step\":[0-9]*,\"loss\":$num,\"lr\":$num,\"grad_norm\":$num}\$"
if [ -s "$D/falls.jsonl" ] && [ "$(grep -c "$line" "$D/falls.jsonl")" -eq 30 ] &&
   [ "$(wc -l < "$D/falls.jsonl")" -eq 30 ] &&
   [ "$(field step "$D/falls.jsonl" | tr '\n' ' ')" = "$(seq 1 30 | tr '\n' ' ')" ]; then
    pass log-format
else
    fail log-format "$D/falls.jsonl: not 30 lines of {\"step\":t,\"loss\":..,\"lr\":..,..}"
fi

# -- Mixture of experts --------------------------------------------------------------------

MOE="$TINY --experts 4 --top-k 2 --expert-ffn 64"

# The loss falls with 4 experts, top-2 and the aux loss on; every log line carries aux_loss,
# in order step, loss, aux_loss, lr, grad_norm; the aux loss of a balanced router is near
# coeff * layers (0.02).
if run_ok moe-loss-falls $REF $MOE --aux-coeff 0.01 --random-init 1 --data "$D/syn64.bin" \
        --steps 30 --mbs 4 --lr 3e-3 --warmup 3 --log "$D/moe_falls.jsonl"; then
    first=$(field loss "$D/moe_falls.jsonl" | head -n 1)
    last=$(field loss "$D/moe_falls.jsonl" | tail -n 1)
    if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }'; then
        pass moe-loss-falls
    else
        fail moe-loss-falls "loss went from $first to $last in 30 steps (want a drop > 1.0)"
    fi
    line="^{\"step\":[0-9]*,\"loss\":$num,\"aux_loss\":$num,\"lr\":$num,\"grad_norm\":$num}\$"
    if [ "$(grep -c "$line" "$D/moe_falls.jsonl")" -eq 30 ] &&
       [ "$(wc -l < "$D/moe_falls.jsonl")" -eq 30 ] &&
       field aux_loss "$D/moe_falls.jsonl" | awk '$1 < 0.02 || $1 > 0.03 { bad = 1 }
                                                  END { exit bad }'; then
        pass moe-log-format
    else
        fail moe-log-format "$D/moe_falls.jsonl: not 30 lines of step, loss, aux_loss (in" \
             "[0.02, 0.03]), lr, grad_norm"
    fi
fi

# Micro-batches: without aux loss and capacity the MoE is token-wise, so any (mbs, nmb, dp)
# split of the global batch gives the same losses (1e-12). The aux loss and the capacity are
# per micro-batch: at a fixed mbs, splits over nmb and dp give byte-identical logs, while
# mbs 4 and mbs 1 give different aux losses.
moe_acc_ok=1
losses_agree moe-accum macc "4:1:1 1:4:1 2:1:2 1:2:2" \
    $REF $MOE --random-init 2 --data "$D/syn64.bin" --steps 4 --lr 1e-2 || moe_acc_ok=0
if [ $moe_acc_ok -eq 1 ]; then
    for split in "4 1 1" "1 4 1" "1 2 2" "1 1 4"; do
        set -- $split
        run_ok moe-accum $REF $MOE --aux-coeff 0.1 --capacity 1.0 --random-init 2 \
            --data "$D/syn64.bin" --steps 4 --mbs $1 --nmb $2 --dp $3 --lr 1e-2 \
            --log "$D/maux_$1_$2_$3.jsonl" || moe_acc_ok=0
    done
    if [ $moe_acc_ok -eq 1 ]; then
        if ! cmp -s "$D/maux_1_4_1.jsonl" "$D/maux_1_2_2.jsonl" ||
           ! cmp -s "$D/maux_1_4_1.jsonl" "$D/maux_1_1_4.jsonl"; then
            fail moe-accum "aux loss: mbs 1 runs split differently over nmb and dp differ"
        elif [ "$(field aux_loss "$D/maux_4_1_1.jsonl" | head -n 1)" = \
               "$(field aux_loss "$D/maux_1_4_1.jsonl" | head -n 1)" ]; then
            fail moe-accum "aux loss: mbs 4 and mbs 1 give the same aux loss (not per micro-batch?)"
        else
            pass moe-accum
        fi
    fi
fi

# Checkpoints of a mixture of experts (the checkpoint names, expert biases included) round-trip, and
# a run from --init of --save-init equals the --random-init run.
MOEB="$MOE --expert-bias --aux-coeff 0.01"
if run_ok moe-save-roundtrip $REF $MOEB --random-init 9 --save-init "$D/moe_a.safetensors" &&
   run_ok moe-save-roundtrip $REF $MOEB --init "$D/moe_a.safetensors" \
        --save-init "$D/moe_b.safetensors" &&
   run_ok moe-save-roundtrip $REF $MOEB --random-init 9 --data "$D/syn64.bin" --steps 3 \
        --log "$D/moe_seed.jsonl" --save "$D/moe_final_seed.safetensors" &&
   run_ok moe-save-roundtrip $REF $MOEB --init "$D/moe_a.safetensors" --data "$D/syn64.bin" \
        --steps 3 --log "$D/moe_file.jsonl" --save "$D/moe_final_file.safetensors"; then
    if ! cmp -s "$D/moe_a.safetensors" "$D/moe_b.safetensors"; then
        fail moe-save-roundtrip "load + save changed the file"
    elif ! cmp -s "$D/moe_seed.jsonl" "$D/moe_file.jsonl" ||
         ! cmp -s "$D/moe_final_seed.safetensors" "$D/moe_final_file.safetensors"; then
        fail moe-save-roundtrip "training from --init of --save-init differs from --random-init"
    elif ! head -c 8192 "$D/moe_a.safetensors" | tr -d '\000' |
           grep -q '"h.0.mlp.router.weight":{"dtype":"F32","shape":\[4,32\]' ||
         ! head -c 8192 "$D/moe_a.safetensors" | tr -d '\000' |
           grep -q '"h.1.mlp.experts.3.c_proj.bias":{"dtype":"F32","shape":\[32\]'; then
        fail moe-save-roundtrip "header lacks h.0.mlp.router.weight [4,32] or an expert bias"
    else
        pass moe-save-roundtrip
    fi
fi

# -- Checkpoints ------------------------------------------------------------------------------

# --save-init writes the model; loading it and saving again gives the same bytes; and a run
# from that file equals the run from --random-init (random init values are float32 already).
if run_ok save-roundtrip $REF $TINY --random-init 9 --save-init "$D/init_a.safetensors" &&
   run_ok save-roundtrip $REF $TINY --init "$D/init_a.safetensors" \
        --save-init "$D/init_b.safetensors" &&
   run_ok save-roundtrip $REF $TINY --random-init 9 --data "$D/syn64.bin" --steps 3 \
        --log "$D/from_seed.jsonl" --save "$D/final_seed.safetensors" &&
   run_ok save-roundtrip $REF $TINY --init "$D/init_a.safetensors" --data "$D/syn64.bin" \
        --steps 3 --log "$D/from_file.jsonl" --save "$D/final_file.safetensors"; then
    if ! cmp -s "$D/init_a.safetensors" "$D/init_b.safetensors"; then
        fail save-roundtrip "load + save changed the file"
    elif ! cmp -s "$D/from_seed.jsonl" "$D/from_file.jsonl" ||
         ! cmp -s "$D/final_seed.safetensors" "$D/final_file.safetensors"; then
        fail save-roundtrip "training from --init of --save-init differs from --random-init"
    elif [ -e "$D/init_a.safetensors.tmp" ]; then
        fail save-roundtrip "a .tmp file was left behind"
    else
        pass save-roundtrip
    fi
fi

# -- Error messages: exit code and exact first line of stderr --------------------------------

# expect_err NAME EXIT 'first line' CMD...
expect_err() {
    name=$1; want_rc=$2; want=$3; shift 3
    "$@" > "$D/$name.out" 2> "$D/$name.err"
    rc=$?
    got=$(head -n 1 "$D/$name.err")
    if [ $rc -ne "$want_rc" ]; then
        fail "$name" "exit $rc (want $want_rc): $got"
    elif [ "$got" != "$want" ]; then
        fail "$name" "first line '$got', want '$want'"
    else
        pass "$name"
    fi
}

SMALL="--layers 1 --hidden 4 --heads 2 --seq 3 --vocab 5"
$REF $SMALL --random-init 1 --save-init "$D/l1.safetensors" > /dev/null
$REF --layers 2 --hidden 4 --heads 2 --seq 3 --vocab 5 --random-init 1 \
    --save-init "$D/l2.safetensors" > /dev/null
$REF --layers 1 --hidden 4 --heads 2 --seq 6 --vocab 5 --random-init 1 \
    --save-init "$D/seq6.safetensors" > /dev/null
"$UNIT" mkbad st-dtype "$D/dtype.safetensors"
"$UNIT" mkbad st-json "$D/json.safetensors"
"$UNIT" mkbad st-offsets "$D/offsets.safetensors"
printf 'abc' > "$D/short.safetensors"

expect_err err-missing-tensor 1 "$D/l1.safetensors: error: missing tensor 'h.1.ln_1.weight'" \
    $REF --layers 2 --hidden 4 --heads 2 --seq 3 --vocab 5 --init "$D/l1.safetensors"
expect_err err-extra-tensor 1 "$D/l2.safetensors: error: unexpected tensor 'h.1.ln_1.weight'" \
    $REF $SMALL --init "$D/l2.safetensors"
expect_err err-shape 1 \
    "$D/seq6.safetensors: error: tensor 'wpe.weight' has shape [6,4], expected [3,4]" \
    $REF $SMALL --init "$D/seq6.safetensors"
want="$D/dtype.safetensors: error: tensor 'ln_f.bias' has dtype I32;"
expect_err err-dtype 1 "$want expected F32, BF16, F16 or F64" \
    $REF $SMALL --init "$D/dtype.safetensors"
expect_err err-st-json 1 \
    "$D/json.safetensors: error: bad safetensors header at byte 37: expected ',' or '}'" \
    $REF $SMALL --init "$D/json.safetensors"
want="$D/offsets.safetensors: error: tensor 'wte.weight':"
expect_err err-st-offsets 1 "$want data_offsets [0,80] outside the 40 data bytes" \
    $REF $SMALL --init "$D/offsets.safetensors"
expect_err err-st-short 1 \
    "$D/short.safetensors: error: not a safetensors file: 3 bytes, no header length" \
    $REF $SMALL --init "$D/short.safetensors"
expect_err err-init-absent 1 \
    "$D/absent.safetensors: error: cannot open: No such file or directory" \
    $REF $SMALL --init "$D/absent.safetensors"

# Token files: odd size, out-of-range id, too short, and broken llm.c shards.
"$TOK" --vocab 256 --tokens 100 "$D/t100.bin"
"$TOK" --vocab 256 --tokens 100 --shard "$D/t100_shard.bin"
"$TOK" --vocab 256 --tokens 3 "$D/t3.bin"
head -c 151 "$D/t100.bin" > "$D/odd.bin"
printf '\005\000\054\001\007\000\001\000\002\000' > "$D/oor.bin"       # 5, 300, 7, 1, 2
head -c 1100 "$D/t100_shard.bin" > "$D/shard_trunc.bin"
{ cat "$D/t100_shard.bin"; printf '\000\000'; } > "$D/shard_extra.bin"
cp "$D/t100_shard.bin" "$D/shard_v2.bin"
printf '\002' | dd of="$D/shard_v2.bin" bs=1 seek=4 conv=notrunc 2> /dev/null
DATA_RUN="$REF --layers 1 --hidden 4 --heads 2 --seq 3 --vocab 256 --random-init 1 --steps 1"

expect_err err-data-odd 1 \
    "$D/odd.bin: error: truncated token file: odd size 151 bytes, not whole uint16 tokens" \
    $DATA_RUN --data "$D/odd.bin"
expect_err err-data-range 1 \
    "$D/oor.bin: error: token 300 at position 1 is out of range for vocab 256" \
    $DATA_RUN --data "$D/oor.bin"
expect_err err-data-short 1 \
    "$D/t3.bin: error: 3 tokens are too few for one sample of seq 3 (need 4)" \
    $DATA_RUN --data "$D/t3.bin"
want="$D/shard_trunc.bin: error: truncated llm.c shard: header says 100 tokens (200 bytes),"
expect_err err-shard-truncated 1 "$want file has 76 bytes after the header" \
    $DATA_RUN --data "$D/shard_trunc.bin"
expect_err err-shard-extra 1 \
    "$D/shard_extra.bin: error: llm.c shard has 2 bytes after its 100 tokens" \
    $DATA_RUN --data "$D/shard_extra.bin"
expect_err err-shard-version 1 \
    "$D/shard_v2.bin: error: llm.c shard version 2 is not supported (only 1: uint16 tokens)" \
    $DATA_RUN --data "$D/shard_v2.bin"
expect_err err-data-absent 1 "$D/absent.bin: error: cannot open: No such file or directory" \
    $DATA_RUN --data "$D/absent.bin"

# Usage errors exit 2.
expect_err err-usage-heads 2 "gpt2_ref: error: --heads (3) must divide --hidden (4)" \
    $REF --layers 1 --hidden 4 --heads 3 --seq 3 --vocab 5 --random-init 1
expect_err err-usage-init 2 \
    "gpt2_ref: error: give exactly one of --init FILE and --random-init SEED" \
    $REF $SMALL
expect_err err-usage-data 2 "gpt2_ref: error: --data is required when --steps > 0" \
    $REF $SMALL --random-init 1 --steps 2
expect_err err-usage-flag 2 "gpt2_ref: error: unknown flag '--layer'" \
    $REF --layer 1
expect_err err-moe-missing 1 "$D/l1.safetensors: error: missing tensor 'h.0.mlp.router.weight'" \
    $REF $SMALL --experts 2 --top-k 1 --pre-softmax --init "$D/l1.safetensors"
expect_err err-usage-moe-flag 2 "gpt2_ref: error: --aux-coeff needs --experts" \
    $REF $SMALL --random-init 1 --aux-coeff 0.01
expect_err err-usage-moe-topk 2 "gpt2_ref: error: --top-k (3) must be between 1 and --experts (2)" \
    $REF $SMALL --random-init 1 --experts 2 --top-k 3
TOP1="gpt2_ref: error: --top-k 1 needs --pre-softmax (a softmax over one logit is 1: no router"
expect_err err-usage-moe-top1 2 "$TOP1 gradient)" $REF $SMALL --random-init 1 --experts 2 --top-k 1
expect_err err-usage-moe-capacity 2 "gpt2_ref: error: --capacity must be > 0" \
    $REF $SMALL --random-init 1 --experts 2 --top-k 2 --capacity 0

# -- Llama (--arch llama) ---------------------------------------------------------------------

LTINY="--arch llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --seq 32 --vocab 64"

# The loss falls: 30 steps of a GQA Llama on the period-13 pattern; the log has the dense keys.
if run_ok llama-loss-falls $REF $LTINY --random-init 1 --data "$D/syn64.bin" --steps 30 \
        --mbs 4 --lr 3e-3 --warmup 3 --log "$D/llama_falls.jsonl"; then
    first=$(field loss "$D/llama_falls.jsonl" | head -n 1)
    last=$(field loss "$D/llama_falls.jsonl" | tail -n 1)
    line="^{\"step\":[0-9]*,\"loss\":$num,\"lr\":$num,\"grad_norm\":$num}\$"
    if ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }'; then
        fail llama-loss-falls "loss went from $first to $last in 30 steps (want a drop > 1.0)"
    elif [ "$(grep -c "$line" "$D/llama_falls.jsonl")" -ne 30 ]; then
        fail llama-loss-falls "$D/llama_falls.jsonl: not 30 lines of step, loss, lr, grad_norm"
    else
        pass llama-loss-falls
    fi
fi

# Any (mbs, nmb, dp) split of a global batch of 4 gives the same losses (1e-12).
if losses_agree llama-accum lacc "4:1:1 1:4:1 2:1:2 1:1:4" \
        $REF $LTINY --random-init 2 --data "$D/syn64.bin" --steps 4 --lr 1e-2; then
    pass llama-accum
fi

# Checkpoints with Hugging Face Llama / Mixtral names round-trip, and a run from --init of
# --save-init equals the --random-init run; tied models have no lm_head.weight.
for v in dense moe; do
    t=llama-save-roundtrip-$v
    if [ $v = dense ]; then flags="$LTINY"; else
        flags="$LTINY --tie-embeddings --experts 4 --top-k 2 --expert-ffn 16 --aux-coeff 0.01"
    fi
    if run_ok $t $REF $flags --random-init 9 \
            --save-init "$D/llama_${v}_a.safetensors" &&
       run_ok $t $REF $flags --init "$D/llama_${v}_a.safetensors" \
            --save-init "$D/llama_${v}_b.safetensors" &&
       run_ok $t $REF $flags --random-init 9 --data "$D/syn64.bin" \
            --steps 3 --log "$D/llama_${v}_seed.jsonl" --save "$D/llama_${v}_fs.safetensors" &&
       run_ok $t $REF $flags --init "$D/llama_${v}_a.safetensors" \
            --data "$D/syn64.bin" --steps 3 --log "$D/llama_${v}_file.jsonl" \
            --save "$D/llama_${v}_ff.safetensors"; then
        hdr="$D/llama_${v}.header"
        head -c 16384 "$D/llama_${v}_a.safetensors" | tr -d '\000' > "$hdr"
        if [ $v = dense ]; then
            want='"model.layers.1.self_attn.k_proj.weight":{"dtype":"F32","shape":\[16,32\]'
            want2='"lm_head.weight":{"dtype":"F32","shape":\[64,32\]'
        else
            want='"model.layers.1.block_sparse_moe.experts.3.w2.weight":{"dtype":"F32",'
            want="$want"'"shape":\[32,16\]'
            want2='"model.layers.0.block_sparse_moe.gate.weight":{"dtype":"F32","shape":\[4,32\]'
        fi
        if ! cmp -s "$D/llama_${v}_a.safetensors" "$D/llama_${v}_b.safetensors"; then
            fail $t "load + save changed the file"
        elif ! cmp -s "$D/llama_${v}_seed.jsonl" "$D/llama_${v}_file.jsonl" ||
             ! cmp -s "$D/llama_${v}_fs.safetensors" "$D/llama_${v}_ff.safetensors"; then
            fail $t "training from --init of --save-init differs"
        elif ! grep -q "$want" "$hdr" || ! grep -q "$want2" "$hdr" ||
             { [ $v = moe ] && grep -q lm_head "$hdr"; }; then
            fail $t "header lacks a Llama tensor, or has lm_head when tied"
        else
            pass $t
        fi
    fi
done

# Usage errors of the Llama flags (exit 2), and a GPT-2 checkpoint for a Llama model (exit 1).
LSMALL="--layers 1 --hidden 8 --heads 2 --seq 3 --vocab 5 --random-init 1"
expect_err err-llama-kv-gpt2 2 "gpt2_ref: error: --kv-heads needs --arch llama" \
    $REF $LSMALL --kv-heads 1
expect_err err-llama-arch 2 "gpt2_ref: error: --arch must be gpt2 or llama, got 'mistral'" \
    $REF $LSMALL --arch mistral
expect_err err-llama-kv-divide 2 "gpt2_ref: error: --kv-heads (3) must divide --heads (2)" \
    $REF $LSMALL --arch llama --ffn 8 --kv-heads 3
expect_err err-llama-head-dim 2 \
    "gpt2_ref: error: --arch llama needs an even head dim (--hidden / --heads = 3) for rope" \
    $REF --layers 1 --hidden 6 --heads 2 --seq 3 --vocab 5 --random-init 1 --arch llama --ffn 8
expect_err err-llama-ffn 2 "gpt2_ref: error: --ffn is required with --arch llama" \
    $REF $LSMALL --arch llama
expect_err err-llama-expert-bias 2 \
    "gpt2_ref: error: --expert-bias needs --arch gpt2 (Mixtral experts have no biases)" \
    $REF $LSMALL --arch llama --experts 2 --top-k 2 --expert-ffn 4 --expert-bias
expect_err err-llama-gpt2-file 1 \
    "$D/l1.safetensors: error: missing tensor 'model.embed_tokens.weight'" \
    $REF --layers 1 --hidden 4 --heads 2 --seq 3 --vocab 5 --arch llama --ffn 8 \
    --init "$D/l1.safetensors"

# -- Against PyTorch (float64) ---------------------------------------------------------------

# golden_agree TAG GOLDEN LOG KEY:COL...: each KEY's values in the reference's LOG (one a step)
# against column COL of the lines of GOLDEN (torch's numbers, 8 steps), to 1e-12, via
# $D/TAG.got and $D/TAG.want. Prints the first differences and returns 1 when they disagree.
golden_agree() {
    local tag=$1 golden=$2 log=$3 pair
    shift 3
    for pair in "$@"; do field "${pair%%:*}" "$log"; done > "$D/$tag.got"
    for pair in "$@"; do cut -d' ' -f"${pair#*:}" "$golden"; done > "$D/$tag.want"
    if [ "$(wc -l < "$D/$tag.got")" -ne $((8 * $#)) ] ||
       ! same_values "$D/$tag.got" "$D/$tag.want" 1e-12 > "$D/$tag.diff"; then
        head -n 5 "$D/$tag.diff"
        return 1
    fi
}

# 8 steps, global batch 6 = mbs 1 x nmb 3 x dp 2 from a shard, warm-up 2, clipping active early
# (grad norms above 1). torch-golden compares the log with torch's numbers recorded in
# tests/refcheck/torch_golden.txt (runs everywhere); torch re-runs torch when it is installed
# and also compares the final weights. Loss, lr and norm must agree to 1e-12, weights to 1 ulp.
TC="--layers 2 --hidden 16 --heads 2 --seq 12 --vocab 64"
TC_ARGS="2 16 2 12 64 1 3 2 1e-2 1e-3 2 8 8"
tc_ok=0
if run_ok torch-golden $REF $TC --random-init 4 --save-init "$D/tc_init.safetensors" &&
   run_ok torch-golden $REF $TC --init "$D/tc_init.safetensors" --data "$D/syn64_shard.bin" \
        --steps 8 --mbs 1 --nmb 3 --dp 2 --lr 1e-2 --min-lr 1e-3 --warmup 2 \
        --log "$D/tc.jsonl" --save "$D/tc_final.safetensors"; then
    tc_ok=1
    grep -v '^#' tests/refcheck/torch_golden.txt > "$D/golden.txt"
    if ! field grad_norm "$D/tc.jsonl" | awk '$1 > 1 { n++ } END { exit !(n > 0) }'; then
        fail torch-golden "no step had a grad norm above the clip (1.0): clipping not exercised"
    elif ! golden_agree tc "$D/golden.txt" "$D/tc.jsonl" loss:2 lr:3 grad_norm:4; then
        fail torch-golden "loss/lr/grad_norm differ from torch's (tests/refcheck/torch_golden.txt)"
    else
        pass torch-golden
    fi
fi

# The mixture of experts against torch (tests/refcheck/torch_moe_check.py: the MoE written the
# way Megatron computes it, differentiated by autograd), two runs of 8 steps from a shard:
#   a: 4 experts top-2 width 24 with biases, aux 0.1, capacity 1.0 (tokens dropped),
#      mbs 2 x nmb 2 x dp 1;
#   b: 4 experts top-1 pre-softmax, no biases, aux 0.05, mbs 1 x nmb 3 x dp 2.
# torch-moe-golden compares the logs with torch's numbers in torch_moe_golden.txt (everywhere),
# torch-moe reruns torch when installed and also compares the final weights; 1e-12 and 1 ulp.
MA="--experts 4 --top-k 2 --expert-ffn 24 --expert-bias --aux-coeff 0.1 --capacity 1.0"
MA="$MA --drop-policy position"     # torch_common.capacity_keep: the earliest rows
MA_ARGS="4 2 24 1 0 0.1 1.0"
MA_RUN="--mbs 2 --nmb 2 --dp 1"
MA_TC="2 16 2 12 64 2 2 1 1e-2 1e-3 2 8 8"
MB="--experts 4 --top-k 1 --expert-ffn 24 --pre-softmax --aux-coeff 0.05"
MB_ARGS="4 1 24 0 1 0.05 0"
MB_RUN="--mbs 1 --nmb 3 --dp 2"
MB_TC="2 16 2 12 64 1 3 2 1e-2 1e-3 2 8 8"
tm_ok=1
for r in a b; do
    if [ $r = a ]; then flags=$MA; run=$MA_RUN; else flags=$MB; run=$MB_RUN; fi
    if ! run_ok torch-moe-golden $REF $TC $flags --random-init 4 \
            --save-init "$D/tm_${r}_init.safetensors" ||
       ! run_ok torch-moe-golden $REF $TC $flags --init "$D/tm_${r}_init.safetensors" \
            --data "$D/syn64_shard.bin" --steps 8 $run --lr 1e-2 --min-lr 1e-3 --warmup 2 \
            --log "$D/tm_$r.jsonl" --save "$D/tm_${r}_final.safetensors"; then
        tm_ok=0
        break
    fi
    grep "^$r " tests/refcheck/torch_moe_golden.txt > "$D/tm_$r.golden"
    if ! golden_agree tm_$r "$D/tm_$r.golden" "$D/tm_$r.jsonl" \
            loss:3 aux_loss:4 lr:5 grad_norm:6; then
        fail torch-moe-golden "run $r: loss/aux_loss/lr/grad_norm differ from torch's" \
             "(tests/refcheck/torch_moe_golden.txt)"
        tm_ok=0
    fi
done
[ $tm_ok -eq 1 ] && pass torch-moe-golden

# Llama against torch (tests/refcheck/torch_llama_check.py: Hugging Face's Llama / Mixtral
# formulas -- RMSNorm, rotate_half rope, repeat_kv GQA, SwiGLU -- differentiated by autograd),
# four runs of 8 steps from a shard, each with the flags of its line (given to the reference and
# to the script alike):
#   a: GQA (4 heads, 2 kv heads) C=32, untied, mbs 1 x nmb 3 x dp 2;
#   b: 2 heads sharing 1 kv head, tied, rope theta 100, eps 1e-6, mbs 2 x nmb 2;
#   c: Mixtral experts: 4 top-2 width 24, aux 0.1, capacity 1.0 (tokens dropped), mbs 2 x nmb 2;
#   d: 4 experts top-1 pre-softmax, aux 0.05, 1 kv head, tied, mbs 1 x nmb 3 x dp 2.
# torch-llama-golden compares the logs with torch's numbers in torch_llama_golden.txt
# (everywhere), torch-llama reruns torch when installed and also compares the final weights.
# llama_run R: set $flags (the model) and $run (the batch and schedule) of run R.
llama_run() {
    flags="--arch llama --layers 2 --seq 12 --vocab 64"
    run="--lr 1e-2 --min-lr 1e-3 --warmup 2 --steps 8"
    case $1 in
    a) flags="$flags --hidden 32 --heads 4 --kv-heads 2 --ffn 48"
       run="$run --mbs 1 --nmb 3 --dp 2";;
    b) flags="$flags --hidden 16 --heads 2 --kv-heads 1 --ffn 40 --tie-embeddings"
       flags="$flags --rope-theta 100 --norm-eps 1e-6"
       run="$run --mbs 2 --nmb 2";;
    c) flags="$flags --hidden 16 --heads 4 --kv-heads 2 --experts 4 --top-k 2"
       flags="$flags --expert-ffn 24 --aux-coeff 0.1 --capacity 1.0 --drop-policy position"
       run="$run --mbs 2 --nmb 2";;
    d) flags="$flags --hidden 16 --heads 4 --kv-heads 1 --experts 4 --top-k 1"
       flags="$flags --expert-ffn 24 --pre-softmax --aux-coeff 0.05 --tie-embeddings"
       run="$run --mbs 1 --nmb 3 --dp 2";;
    esac
}
tl_ok=1
for r in a b c d; do
    llama_run $r
    if ! run_ok torch-llama-golden $REF $flags --random-init 4 \
            --save-init "$D/tl_${r}_init.safetensors" ||
       ! run_ok torch-llama-golden $REF $flags $run --init "$D/tl_${r}_init.safetensors" \
            --data "$D/syn64_shard.bin" --log "$D/tl_$r.jsonl" \
            --save "$D/tl_${r}_final.safetensors"; then
        tl_ok=0
        break
    fi
    cols="loss:3 lr:5 grad_norm:6"
    case $r in c|d) cols="$cols aux_loss:4";; esac
    grep "^$r " tests/refcheck/torch_llama_golden.txt > "$D/tl_$r.golden"
    if ! golden_agree tl_$r "$D/tl_$r.golden" "$D/tl_$r.jsonl" $cols; then
        fail torch-llama-golden "run $r: loss/aux_loss/lr/grad_norm differ from torch's" \
             "(tests/refcheck/torch_llama_golden.txt)"
        tl_ok=0
    fi
done
[ $tl_ok -eq 1 ] && pass torch-llama-golden

PY=$(torch_python)
if [ -z "$PY" ]; then
    echo "SKIP refcheck/torch: PyTorch not installed (apt-get install python3-torch)"
elif [ $tc_ok -eq 1 ]; then
    if "$PY" tests/refcheck/torch_check.py "$D/tc_init.safetensors" "$D/syn64_shard.bin" \
            "$D/tc.jsonl" "$D/tc_final.safetensors" $TC_ARGS > "$D/torch.txt" 2>&1; then
        pass torch
    else
        tail -n 5 "$D/torch.txt"
        fail torch "$(tail -n 1 "$D/torch.txt")"
    fi
fi
if [ -z "$PY" ]; then
    echo "SKIP refcheck/torch-moe: PyTorch not installed (apt-get install python3-torch)"
elif [ -s "$D/tm_b.jsonl" ]; then
    if "$PY" tests/refcheck/torch_moe_check.py "$D/tm_a_init.safetensors" \
            "$D/syn64_shard.bin" "$D/tm_a.jsonl" "$D/tm_a_final.safetensors" $MA_TC $MA_ARGS \
            > "$D/torch_moe.txt" 2>&1 &&
       "$PY" tests/refcheck/torch_moe_check.py "$D/tm_b_init.safetensors" \
            "$D/syn64_shard.bin" "$D/tm_b.jsonl" "$D/tm_b_final.safetensors" $MB_TC $MB_ARGS \
            >> "$D/torch_moe.txt" 2>&1; then
        pass torch-moe
    else
        tail -n 5 "$D/torch_moe.txt"
        fail torch-moe "$(tail -n 1 "$D/torch_moe.txt")"
    fi
fi
if [ -z "$PY" ]; then
    echo "SKIP refcheck/torch-llama: PyTorch not installed (apt-get install python3-torch)"
elif [ -s "$D/tl_d.jsonl" ]; then
    : > "$D/torch_llama.txt"
    tl_live=1
    for r in a b c d; do
        llama_run $r
        if ! "$PY" tests/refcheck/torch_llama_check.py $flags $run \
                --init "$D/tl_${r}_init.safetensors" --data "$D/syn64_shard.bin" \
                --log "$D/tl_$r.jsonl" --final "$D/tl_${r}_final.safetensors" \
                >> "$D/torch_llama.txt" 2>&1; then
            tl_live=0
            break
        fi
    done
    if [ $tl_live -eq 1 ]; then
        pass torch-llama
    else
        tail -n 5 "$D/torch_llama.txt"
        fail torch-llama "run $r: $(tail -n 1 "$D/torch_llama.txt")"
    fi
fi
finish
