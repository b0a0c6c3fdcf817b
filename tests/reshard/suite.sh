#!/bin/bash
# tests/reshard/suite.sh: --reshard-from (README.md, "Changing the layout of a run"): a run
# stopped with a resume checkpoint goes on in another layout of the same model.
#  * tests/reshard/layouts.txt: from TP x DP with SP and the distributed optimizer to PP, PP x
#    VP, CP, DP 4, one rank and its own layout (bit for bit); from one rank to TP 4; bf16 with
#    sharded main parameters; MoE with the expert bias. Each resharded run's steps 4-6 and final
#    weights match those of the run that went on in the first layout;
#  * tests/reshard/gpu.txt: train_cuda resumes and reshards the CPU's checkpoint, on a GPU (built
#    only without one) and on the CPU emulation of CUDA;
#  * the values themselves: every parameter of the resharded program is the checkpoint's, bit
#    for bit, f32 to bf16 training and bf16 to f32;
#  * a resharded run that is stopped resumes from its own checkpoint (--resume wins over
#    --reshard-from), bit for bit: a requeued job keeps both flags;
#  * another global batch: the next step reads the samples after those read so far, and the
#    resharded run's own checkpoints carry that on;
#  * the errors, each before anything is loaded or written: another model, a rank file missing, a damaged file, a version 4 file (no index), no checkpoint,
#    --reshard-from as --ckpt-dir, with --init.
# Protocol: tests/lib.sh; scratch in build/test/reshard/.
. "$(dirname "$0")/../lib.sh" reshard

if ! make -s --no-print-directory build/gen build/librt_cpu.a ref build/tools/stcompare \
        > "$S/make.log" 2>&1; then
    fail setup "make build/gen librt_cpu.a ref stcompare failed: $(tail -n 1 "$S/make.log")"
    finish
fi
if ! have_mpi; then
    skip all "mpirun not found (make deps)"
    finish
fi
build/ref/make_tokens --vocab 256 --tokens 20000 --seed 3 "$S/tiny.bin" > "$S/ref.log" 2>&1 || {
    fail setup "cannot make the token file: $(tail -n 1 "$S/ref.log")"
    finish
}

equiv tests/reshard/layouts.txt
equiv tests/reshard/gpu.txt --cuda
equiv tests/reshard/gpu.txt --emu

R=$S/run
TRAIN=(--data "$S/tiny.bin" --steps 6 --seed 7)

# -- The values: every parameter as the checkpoint holds it ------------------------------------
# at3 NAME FROM ROW ARGS...: ROW's program saves the f32 parameters it starts from at step 3
# (--steps 3: no step runs) into $R/NAME.safetensors
at3() {
    local name=$1 row=$2
    shift 2
    run_prog "${DIR[$row]}/train" "${WORLD[$row]}" "$R/$name.log" "${TRAIN[@]}" --steps 3 \
        --save "$R/$name.safetensors" "$@"
}
# values NAME STOP ROW: the resharded ROW's parameters are STOP's checkpoint's, bit for bit
values() {
    local name=$1 stop=$2 row=$3
    if [ -z "${DIR[$stop]}" ] || [ -z "${DIR[$row]}" ] || [ ! -d "$R/$stop.ck" ]; then
        fail "$name" "the $stop or $row row did not build or run"
    elif ! at3 "$name.a" "$stop" --resume --ckpt-dir "$R/$stop.ck"; then
        fail "$name" "resuming $stop failed: $(first_error "$R/$name.a.log")"
    elif ! at3 "$name.b" "$row" --reshard-from "$R/$stop.ck"; then
        fail "$name" "resharding into $row failed: $(first_error "$R/$name.b.log")"
    elif ! $STCOMPARE -q --exact "$R/$name.b.safetensors" "$R/$name.a.safetensors" \
            > "$R/$name.cmp" 2>&1; then
        fail "$name" "$(tail -n 1 "$R/$name.cmp")"
    else
        pass "$name"
    fi
}
values values-f32-to-bf16 a-stop b-to-pp2-dp2
values values-bf16-to-f32 b-stop a-to-one
values values-ebias m-stop m-to-tp2-etp2

# -- A resharded run stopped, then requeued with the same flags: it resumes ---------------------
row=a-to-pp2-dp2
if [ ! -s "$R/$row.jsonl" ]; then
    fail requeue "the $row row did not run"
else
    rm -rf "$S/rq"
    args=("${TRAIN[@]}" --reshard-from "$R/a-stop.ck" --ckpt-dir "$S/rq" --resume
          --log "$R/rq.jsonl" --save "$R/rq.safetensors")
    run_prog "${DIR[$row]}/train" 4 "$R/rq1.log" "${args[@]}" --exit-interval 4
    run_prog "${DIR[$row]}/train" 4 "$R/rq2.log" "${args[@]}"
    if ! grep -q "^resharded from $R/a-stop.ck/step_00000003" "$R/rq1.log" ||
       ! grep -q "^resumed from $S/rq/step_00000004" "$R/rq2.log"; then
        fail requeue "want a reshard, then a resume from step 4: $(first_error "$R/rq2.log")"
    elif ! diff <(sed 's/,"ms":.*//' "$R/rq.jsonl") <(sed 's/,"ms":.*//' "$R/$row.jsonl") \
            > "$R/rq.diff" 2>&1 ||
         ! cmp "$R/rq.safetensors" "$R/$row.safetensors" >> "$R/rq.diff" 2>&1; then
        fail requeue "not bit-exact with the run that did not stop: $(head -n 1 "$R/rq.diff")"
    else
        pass requeue
    fi
fi

# -- Another global batch: the samples read so far carry over (Megatron's consumed samples) ----
# With --lr 0 nothing changes the weights after step 3, so each step's loss is the mean loss of
# its samples under step 3's weights: the first layout's steps 4-7 read samples 24-31, ..,
# 48-55; a layout of 16 sequences a step resharded at step 3 reads 24-39 at its step 4 and
# 40-55 at its step 5, whose losses must be the means of those pairs. Then that layout,
# stopped after step 4 and resumed from its own checkpoint, goes on at sample 40: bit for bit.
# steps_loss LOG: "step loss" per line
steps_loss() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1"; }
if ! gen_build "$S/gbs16" tiny --dp 2 --mbs 8; then
    fail batch-change "$WHY"
elif [ -z "${DIR[a-stop]}" ] || [ ! -d "$R/a-stop.ck" ]; then
    fail batch-change "the a-stop row did not run"
else
    rm -rf "$S/lr0" "$S/g16"
    cp -r "$R/a-stop.ck" "$S/lr0"
    run_prog "${DIR[a-stop]}/train" 4 "$R/lr0-a.log" "${TRAIN[@]}" --steps 7 --lr 0 \
        --resume --ckpt-dir "$S/lr0" --log "$R/lr0-a.jsonl"
    run_prog "$S/gbs16/train" 2 "$R/lr0-b.log" "${TRAIN[@]}" --steps 5 --lr 0 \
        --reshard-from "$R/a-stop.ck" --log "$R/lr0-b.jsonl"
    got=$(awk 'NR == FNR { a[$1] = $2; next }
               { want = (a[2 * $1 - 4] + a[2 * $1 - 3]) / 2; d = $2 - want; if (d < 0) d = -d
                 if (d > 1e-5 * want) bad = bad " step " $1 ": " $2 ", want " want; n++ }
               END { print (n == 2 ? "" : "steps: " n) bad }' \
          <(steps_loss "$R/lr0-a.jsonl") <(steps_loss "$R/lr0-b.jsonl"))
    if ! grep -q "^resharded from $R/a-stop.ck/step_00000003 to .*, at sample 24$" \
            "$R/lr0-b.log"; then
        fail batch-change "no reshard at sample 24: $(first_error "$R/lr0-b.log")"
    elif [ -n "$got" ]; then fail batch-change "$got"
    else pass batch-change
    fi
    args=("${TRAIN[@]}" --reshard-from "$R/a-stop.ck" --ckpt-dir "$S/g16" --resume)
    run_prog "$S/gbs16/train" 2 "$R/g16.log" "${args[@]}" --log "$R/g16.jsonl"
    run_prog "$S/gbs16/train" 2 "$R/g16-1.log" "${args[@]}" --exit-interval 4 \
        --log "$R/g16-2.jsonl"
    run_prog "$S/gbs16/train" 2 "$R/g16-2.log" "${args[@]}" --log "$R/g16-2.jsonl"
    if ! grep -q "^resumed from $S/g16/step_00000004" "$R/g16-2.log"; then
        fail batch-change-resume "no resume from step 4: $(first_error "$R/g16-2.log")"
    elif ! diff <(sed 's/,"ms":.*//' "$R/g16-2.jsonl") <(sed 's/,"ms":.*//' "$R/g16.jsonl") \
            > "$R/g16.diff"; then
        fail batch-change-resume "not the run that did not stop: $(head -n 2 "$R/g16.diff")"
    else
        pass batch-change-resume
    fi
fi

# -- Errors: each names what is wrong, every rank stops, nothing is loaded or written ----------
# refused NAME WANT STATUS ROW ARGS...: ROW's program with ARGS (and --ckpt-dir $CKD, by
# default a new $S/e-NAME, and --save) exits STATUS before any step, with the first error line
# WANT (a bash pattern), and writes no checkpoint (no step_N but a-stop's step 3) and no --save
refused() {
    local name=$1 want=$2 status=$3 row=$4 got rc ckd=${CKD:-$S/e-$1}
    shift 4
    if [ -z "${DIR[$row]}" ]; then
        fail "$name" "the $row row did not build"
        return
    fi
    [ -n "$CKD" ] || rm -rf "$ckd"
    run_prog "${DIR[$row]}/train" "${WORLD[$row]}" "$R/e-$name.log" "${TRAIN[@]}" \
        --ckpt-dir "$ckd" --save "$R/e-$name.safetensors" "$@"
    rc=$?
    got=$(grep -m1 "error:" "$R/e-$name.log")
    if [ $rc != "$status" ]; then fail "$name" "status $rc, want $status: $got"
    elif [[ $got != $want ]]; then fail "$name" "got '$got'"
    elif grep -q "^resharded\|^step " "$R/e-$name.log" ||
         ls "$ckd" 2> /dev/null | grep -v '^step_00000003$' | grep -q step_ ||
         [ -e "$R/e-$name.safetensors" ]; then
        fail "$name" "it loaded, trained or wrote something before the error"
    else
        pass "$name"
    fi
}
CK=$R/a-stop.ck/step_00000003
# a copy of a-stop's checkpoint, changed by COMMAND (run in the copy's step directory)
copy_ck() {
    rm -rf "$S/$1"
    mkdir -p "$S/$1"
    cp -r "$CK" "$S/$1/" && (cd "$S/$1/step_00000003" && eval "$2")
}
refused other-model "$CK/rank_00000.bin: error: written by a program of a different model:\
 layers 8 there, 4 here; only the layout can change (that program: make MODEL=tiny TP=2 PP=1\
 DP=2 MBS=2 NMB=2 SP=1 DIST_OPT=1); nothing was loaded" 1 m-to-one --reshard-from "$R/a-stop.ck"
copy_ck missing "rm rank_00003.bin"
refused missing-rank "$S/missing/step_00000003/rank_00003.bin: error: cannot read: No such file\
 or directory; nothing was loaded" 1 a-to-pp2-dp2 --reshard-from "$S/missing"
copy_ck damaged "f=rank_00001.bin; off=\$((\$(stat -c %s \$f) - 100));
    printf '\\377' | dd of=\$f bs=1 seek=\$off conv=notrunc status=none"
refused damaged "$S/damaged/step_00000003/rank_00001.bin: error: damaged: its checksum does not\
 match *; nothing was loaded" 1 a-to-one --reshard-from "$S/damaged"
copy_ck v4 "printf 4 | dd of=rank_00000.bin bs=1 seek=7 conv=notrunc status=none"
refused version-4 "$S/v4/step_00000003/rank_00000.bin: error: a version 4 checkpoint: it has no\
 index of its state, *" 1 a-to-one --reshard-from "$S/v4"
mkdir -p "$S/empty"
refused no-checkpoint "$S/empty: error: --reshard-from: no complete checkpoint (step_N/) here to\
 start from" 1 a-to-one --reshard-from "$S/empty"
copy_ck same true
CKD=$S/same refused same-dir "train: error: --reshard-from $S/same is --ckpt-dir: *" 2 a-to-one \
    --reshard-from "$S/same"
refused with-init "train: error: --reshard-from and --init exclude each other: *" 2 a-to-one \
    --reshard-from "$R/a-stop.ck" --init "$R/a-to-one.safetensors"

finish
