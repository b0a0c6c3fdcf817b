#!/bin/bash
# tests/faults/suite.sh: what clusters do to a training job, injected, and proof that nothing is
# lost (README.md, "When things go wrong"). Every case compares against one clean run of the
# same program: a job stopped by a signal, a time limit, a full disk or a kill in the middle of
# writing a checkpoint must resume from its newest complete checkpoint and end with the clean
# run's weights, bit for bit, and its log, step for step.
#
# Faults come from outside (kill, a small tmpfs) or from GPT_FAULT (lib/faults.c: nan_grad,
# inf_loss, signal, kill_ckpt, stall_ckpt at a step or a point of checkpoint writing).
# The full-disk cases need to mount a tmpfs (root): without that they are skipped, saying so.
. "$(dirname "$0")/../lib.sh" faults

show() { sed 's/^/  /' "$1" | head -n "${2:-12}"; }

if ! command -v pkill > /dev/null; then
    fail setup "pkill not found: the signal tests need it (procps; make deps)"
    finish
fi
if ! make -s --no-print-directory build/gen build/librt_cpu.a build/libgpt_cpu.a ref \
        > "$S/make.log" 2>&1; then
    show "$S/make.log"
    fail setup "make build/gen libraries ref failed"
    finish
fi
V=$(build/gen tiny --dump config 2> /dev/null | sed -n 's/^    "vocab": \([0-9]*\),*$/\1/p' |
    head -n 1)
if ! build/ref/make_tokens --vocab "${V:-0}" --tokens 20000 "$S/tok.bin" > "$S/tok.log" 2>&1;
then
    show "$S/tok.log"
    fail setup "cannot make the token file"
    finish
fi

# One rank, and four (PP 2, DP 2, the distributed optimizer: every rank writes a different
# part of each checkpoint).
build() {
    local name=$1
    shift
    if ! gen_build "$S/$name" tiny "$@"; then
        fail setup "$WHY"
        finish
    fi
}
# The programs by absolute path: the signal tests find their processes by command line
# (pkill -f), which must not match another tree's or another scratch's runs of this suite.
build p1
P1=$(cd "$S/p1" && pwd)/train
if have_mpi; then
    build p4 --pp 2 --dp 2 --dist-opt
    P4=$(cd "$S/p4" && pwd)/train
fi

STEPS=8
HP=(--data "$S/tok.bin" --steps $STEPS --decay-steps $STEPS --quiet)

# run PROG WORLD TAG ARGS...: the program with HP and ARGS into $S/TAG.{log,jsonl}; the status.
run() {
    local prog=$1 world=$2 tag=$3
    shift 3
    RUN_TIMEOUT=120 run_prog "$prog" "$world" "$S/$tag.log" "${HP[@]}" --log "$S/$tag.jsonl" \
        "$@"
}

# same TAG CLEAN: TAG's log and weights are CLEAN's (times aside); WHY says how not.
same() {
    if ! diff <(sed 's/,"ms":.*//' "$S/$1.jsonl") <(sed 's/,"ms":.*//' "$S/$2.jsonl") \
            > "$S/$1.diff" 2>&1; then
        WHY="the log differs from the clean run's: $(sed -n 2p "$S/$1.diff")"
        return 1
    fi
    if ! cmp "$S/$1.safetensors" "$S/$2.safetensors" > "$S/$1.cmp" 2>&1; then
        WHY="the weights differ from the clean run's: $(head -c 200 "$S/$1.cmp")"
        return 1
    fi
}

# the state bytes of a checkpoint file: its last NBYTES, NBYTES the header's fifth uint64
# (lib/ckpt.c ckpt_header)
state() { tail -c "$(od -An -tu8 -j32 -N8 "$1" | tr -d ' ')" "$1"; }

# The clean runs, with a checkpoint every 2 steps (what the faulty runs also do).
run "$P1" 1 clean1 --save "$S/clean1.safetensors" --ckpt-every 2 --ckpt-dir "$S/ck-clean1" ||
    { show "$S/clean1.log"; fail setup "the clean one-rank run failed"; finish; }
if [ -n "$P4" ]; then
    run "$P4" 4 clean4 --save "$S/clean4.safetensors" --ckpt-every 2 \
        --ckpt-dir "$S/ck-clean4" ||
        { show "$S/clean4.log"; fail setup "the clean four-rank run failed"; finish; }
fi

# resumed NAME PROG WORLD TAG CLEAN ARGS...: run TAG again with --resume to the end; it must
# say it resumed (unless RESUME_FROM is "none") and end as CLEAN.
resumed() {
    local name=$1 prog=$2 world=$3 tag=$4 clean=$5
    shift 5
    if ! run "$prog" "$world" "$tag" --save "$S/$tag.safetensors" --resume "$@" \
            > /dev/null 2>&1 < /dev/null; then
        fail "$name" "the resumed run failed: $(first_error "$S/$tag.log")"
    elif [ "${RESUME_FROM:-}" != none ] &&
         ! grep -q "^resumed from .*step_0000000${RESUME_FROM:-[0-9]}$" "$S/$tag.log"; then
        fail "$name" "did not resume from step ${RESUME_FROM:-a checkpoint}: $(head -n 3 \
            "$S/$tag.log" | tr '\n' ' ')"
    elif ! same "$tag" "$clean"; then
        fail "$name" "$WHY"
    else
        pass "$name"
    fi
}

# -- 1. Outputs checked before the first step ----------------------------------------------

# startup NAME WANT ARGS...: the one-rank program with ARGS fails at once (status 1, no step
# run) with the first error line WANT.
startup() {
    local name=$1 want=$2
    shift 2
    run "$P1" 1 "$name" "$@" > /dev/null 2>&1
    local rc=$? got
    got=$(grep -m1 "error:" "$S/$name.log")
    if [ $rc != 1 ]; then fail "$name" "status $rc, want 1: $got"
    elif [ "$got" != "$want" ]; then fail "$name" "got '$got', want '$want'"
    elif [ -s "$S/$name.jsonl" ] || grep -q "^step" "$S/$name.log"; then
        fail "$name" "a step ran before the error"
    else pass "$name"
    fi
}
touch "$S/a-file"
mkdir -p "$S/a-dir"
startup save-unwritable "$S/a-file/model.safetensors: error: cannot create its directory: Not\
 a directory (--save); checked before training, nothing was run" \
    --save "$S/a-file/model.safetensors"
echo notes > "$S/a-dir/notes.txt"
startup save-is-dir "$S/a-dir: error: holds 'notes.txt', which an export does not write: --save\
 DIR replaces a directory only when it holds a Hugging Face export's files alone; remove it or\
 name another directory; checked before training, nothing was run" --save "$S/a-dir"
startup ckpt-unwritable "$S/a-file/ck: error: cannot create the checkpoint directory: Not a\
 directory (--ckpt-dir); checked before training, nothing was run" \
    --ckpt-dir "$S/a-file/ck" --ckpt-every 2
startup log-unwritable "$S/a-file/log.jsonl: error: cannot write the log: Not a directory\
 (--log); checked before training, nothing was run" --log "$S/a-file/log.jsonl"
# An output that is an input, or another output, or not a regular file, and a --ckpt-dir whose
# checkpoint paths would not fit PATH_MAX: refused before anything is opened (a FIFO would
# block the run at its open; --log on the data truncated it; a long --ckpt-dir failed at the
# first checkpoint, its message cut).
cp "$S/tok.bin" "$S/in.bin"
startup log-is-data "$S/in.bin: error: --log would overwrite the input --data reads; give --log\
 another path; checked before training, nothing was run" --data "$S/in.bin" --log "$S/in.bin"
startup save-is-data "$S/in.bin: error: --save would overwrite the input --data reads; give\
 --save another path; checked before training, nothing was run" --data "$S/in.bin" \
    --save "$S/in.bin"
ln -sf in.bin "$S/in-link.bin"
startup log-links-to-data "$S/in-link.bin: error: --log would overwrite the input --data reads;\
 give --log another path; checked before training, nothing was run" --data "$S/in.bin" \
    --log "$S/in-link.bin"
startup save-is-log "$S/./same.out: error: --save and --log name the same file; give --save\
 another path; checked before training, nothing was run" --log "$S/same.out" \
    --save "$S/./same.out"
if run "$P1" 1 init-src --steps 0 --save "$S/init.safetensors" > /dev/null 2>&1; then
    startup log-is-init "$S/init.safetensors: error: --log would overwrite the input --init\
 reads; give --log another path; checked before training, nothing was run" \
        --init "$S/init.safetensors" --log "$S/init.safetensors"
else
    fail log-is-init "--steps 0 --save failed: $(first_error "$S/init-src.log")"
fi
[ -p "$S/fifo" ] || mkfifo "$S/fifo"
startup log-fifo "$S/fifo: error: is a FIFO: --log takes a regular file (a FIFO or device would\
 block or lose the run's writes); checked before training, nothing was run" --log "$S/fifo"
startup init-fifo "$S/fifo: error: is a FIFO: --init takes a regular file or a directory;\
 checked before training, nothing was run" --init "$S/fifo"
startup log-device "/dev/full: error: is a character device: --log takes a regular file (a\
 FIFO or device would block or lose the run's writes); checked before training, nothing was\
 run" --log /dev/full
long=$S/$(printf 'd%.0s' $(seq $((4070 - ${#S} - 1))))
startup ckpt-dir-too-long "--ckpt-dir: error: the path is 4070 characters long: at most 4062,\
 so that the files the run writes there (PATH/step_00000000.old/rank_00000.bin) fit the\
 system's 4096; checked before training, nothing was run" --ckpt-dir "$long" --ckpt-every 2
[ ! -e "$long" ] || fail ckpt-dir-too-long "the directory was made"
# directories that do not exist yet are made
if run "$P1" 1 mkdirs --save "$S/new/a/model.safetensors" --ckpt-dir "$S/new/b/ck" \
        --ckpt-every 4 > /dev/null 2>&1 && [ -f "$S/new/a/model.safetensors" ] &&
   [ -d "$S/new/b/ck/step_00000008" ]; then pass mkdirs
else fail mkdirs "--save and --ckpt-dir in new directories: $(first_error "$S/mkdirs.log")"
fi

# -- 2. A full disk: at start-up, and in the middle of the run ---------------------------------

TMPFS=$S/tmpfs
mkdir -p "$TMPFS"
if mount -t tmpfs -o size=64k tmpfs "$TMPFS" 2> /dev/null; then
    trap 'umount "$TMPFS" 2> /dev/null' EXIT
    run "$P1" 1 disk-startup --ckpt-dir "$TMPFS/ck" --ckpt-every 2 > /dev/null 2>&1
    got=$(grep -m1 "error:" "$S/disk-startup.log")
    if [[ $? == 0 && $got == "$TMPFS/ck: error: not enough free space for a resume checkpoint"* &&
          $got == *"checked before training, nothing was run" ]] &&
       ! grep -q "^step" "$S/disk-startup.log"; then
        pass disk-startup
    else
        fail disk-startup "want the free-space error before any step, got: $got"
    fi
    # room for one checkpoint and a half: step 2 is written, step 4 runs out of space
    CK=$(stat -c %s "$S/ck-clean1/step_00000002/rank_00000.bin")
    umount "$TMPFS"
    mount -t tmpfs -o size=$((CK * 3 / 2 + 65536)) tmpfs "$TMPFS"
    run "$P1" 1 disk-full --ckpt-dir "$TMPFS/ck" --ckpt-every 2 > /dev/null 2>&1
    rc=$?
    got=$(grep -m1 "cannot write the checkpoint" "$S/disk-full.log")
    if [ $rc = 0 ]; then fail disk-full "the run filled the disk and still exited 0"
    elif [[ $got != *"step_00000004.tmp/rank_00000.bin: cannot write the checkpoint of step 4:"*"No space left on device"* ]]; then
        fail disk-full "want the failed write named, got: $(first_error "$S/disk-full.log")"
    elif [ ! -d "$TMPFS/ck/step_00000002" ] || [ -e "$TMPFS/ck/step_00000004" ] ||
         [ -e "$TMPFS/ck/step_00000004.tmp/rank_00000.bin" ]; then
        fail disk-full "want step 2 complete, no step 4 and no partial file: $(ls "$TMPFS/ck")"
    else
        pass disk-full
        # the user makes room; the resumed run cleans up and ends as the clean one
        mount -o remount,size=$((CK * 6 + 65536)) "$TMPFS"
        RESUME_FROM=2 resumed disk-full-resume "$P1" 1 disk-full clean1 --ckpt-dir "$TMPFS/ck" \
            --ckpt-every 2
        grep -q "^removed $TMPFS/ck/step_00000004.tmp" "$S/disk-full.log" ||
            fail disk-full-clean "the resumed run did not remove step_00000004.tmp"
    fi
    umount "$TMPFS"
    trap - EXIT
else
    skip disk-startup "cannot mount a tmpfs here (needs root)"
    skip disk-full "cannot mount a tmpfs here (needs root)"
fi

# The log on a full disk (4 KiB: about 30 lines): the line that does not fit is not written
# (the log ends with whole lines), the job stops after the next step with a checkpoint, names
# the failed write and exits 1 (it went on with its log cut mid-line and exited 0). --save's
# room is checked where --save goes, not on the log's file system.
TL=$S/tmpfs-log
mkdir -p "$TL"
if mount -t tmpfs -o size=4k tmpfs "$TL" 2> /dev/null; then
    trap 'umount "$TL" 2> /dev/null' EXIT
    run "$P1" 1 log-full --steps 40 --decay-steps 40 --log "$TL/log.jsonl" \
        --ckpt-dir "$S/ck-log-full" --save "$S/log-full.safetensors" > /dev/null 2>&1
    rc=$?
    n=$(grep -c '}$' "$TL/log.jsonl")
    after=$((n + 2))
    if [ $rc != 1 ]; then fail log-full "status $rc, want 1: $(first_error "$S/log-full.log")"
    elif ! grep -q "^train: error: $TL/log.jsonl: cannot write the line of step $((n + 1)): No\
 space left on device; the log has the steps before it (the run stopped after the next step,\
 which no line records)$" "$S/log-full.log"; then
        fail log-full "want the failed write named: $(first_error "$S/log-full.log")"
    elif [ "$(tail -c 1 "$TL/log.jsonl" | od -An -c | tr -d ' ')" != '\n' ] ||
         [ "$(wc -l < "$TL/log.jsonl")" != "$n" ]; then
        fail log-full "the log does not end with a whole line: $(tail -c 80 "$TL/log.jsonl")"
    elif ! grep -q "^stopped by a failed write of --log after step $after of 40: saved\
 $S/ck-log-full/step_$(printf %08d $after); continue with --resume$" "$S/log-full.log" ||
         [ ! -d "$S/ck-log-full/step_$(printf %08d $after)" ]; then
        fail log-full "want a checkpoint of step $after: $(grep stopped "$S/log-full.log")"
    else pass log-full
    fi
    umount "$TL"
    trap - EXIT
else
    skip log-full "cannot mount a tmpfs here (needs root)"
fi

# -- 3. Killed while writing a checkpoint, at every point --------------------------------------

# kill_points NAME PROG WORLD CLEAN RANK: kill RANK at the K-th point of checkpoint writing
# (GPT_FAULT=kill_ckpt@K:RANK, SIGKILL as a lost node), then resume; every resumed run must end
# as CLEAN, and --save's file must never exist half-written. The points: the first 4, then
# about 16 spread over the run (every checkpoint and --save), then the last 3; the number a
# whole run passes comes from a run with a kill point it never reaches.
kill_points() {
    local name=$1 prog=$2 world=$3 clean=$4 rank=$5 bad="" ran=0 total k kill=kill-$1
    rm -rf "$S/ck-$kill"
    GPT_FAULT=kill_ckpt@1000000:$rank run "$prog" "$world" $kill --ckpt-dir "$S/ck-$kill" \
        --ckpt-every 2 --save "$S/$kill.safetensors" > /dev/null 2>&1
    total=$(sed -n "s/^train: rank $rank: GPT_FAULT: \([0-9]*\) points .*/\1/p" "$S/$kill.log")
    if [ -z "$total" ] || [ "$total" -lt 8 ]; then
        fail "$name" "a run passes ${total:-no} points of checkpoint writing: $(first_error \
            "$S/$kill.log")"
        return
    fi
    local stride=$(((total + 15) / 16)) points=""
    for ((k = 1; k <= total; k++)); do
        if [ $k -le 4 ] || [ $((k % stride)) = 0 ] || [ $k -gt $((total - 3)) ]; then
            points="$points $k"
        fi
    done
    for k in $points; do
        rm -rf "$S/ck-$kill" "$S/$kill.safetensors"
        GPT_FAULT=kill_ckpt@$k:$rank run "$prog" "$world" $kill --ckpt-dir "$S/ck-$kill" \
            --ckpt-every 2 --save "$S/$kill.safetensors" > /dev/null 2>&1
        local rc=$?
        if [ $rc = 0 ]; then bad="point $k of $total: not killed"; break; fi
        ran=$((ran + 1))
        if [ -e "$S/$kill.safetensors" ]; then
            bad="point $k of $total: --save's file exists after the kill"
            break
        fi
        RESUME_FROM=none resumed "$name-$k" "$prog" "$world" $kill "$clean" \
            --ckpt-dir "$S/ck-$kill" --ckpt-every 2 > "$S/$kill-$k.verdict"
        if ! grep -q "^PASS" "$S/$kill-$k.verdict"; then
            bad="point $k of $total: $(cat "$S/$kill-$k.verdict")"
            break
        fi
    done
    if [ -n "$bad" ]; then fail "$name" "$bad"
    else
        echo "  $name: killed at $ran of the $total points of checkpoint writing (rank $rank)," \
            "each resumed bit-exactly" > "$S/$kill.summary"
        pass "$name"
    fi
}
# The two run beside each other and beside sections 4 and 5 (their own files, no signal sent
# to them): they are most of this suite's time, and the tests below mostly wait. Their
# verdicts come here, the later sections' after them.
# They run copies of the programs (the same bytes), which the signals below (pkill -f by the
# programs' paths) do not match.
cp -p "$P1" "$P1-kill"
(kill_points kill-every-point "$P1-kill" 1 clean1 0 > "$S/kill-p1.verdicts") &
kill1=$!
if [ -n "$P4" ]; then
    cp -p "$P4" "$P4-kill"
    (kill_points kill-every-point-rank3 "$P4-kill" 4 clean4 3 > "$S/kill-p4.verdicts") &
    kill4=$!
fi
exec 9>&1 > "$S/later.out"      # sections 4 and 5, printed after the kill verdicts

# -- 4. Preemption: signals, time limits --------------------------------------------------------

# stopped NAME TAG STEP: TAG's run exited 0 saying it saved step STEP, which is complete.
stopped() {
    local name=$1 tag=$2 step=$3 rc=$4
    if [ "$rc" != 0 ]; then fail "$name" "status $rc: $(first_error "$S/$tag.log")"; return 1; fi
    if ! grep -q "^stopped by .* after step $step of $STEPS: saved $S/ck-$tag/step_0000000$step;\
 continue with --resume$" "$S/$tag.log"; then
        fail "$name" "no 'stopped ... saved' line for step $step: $(tail -n 1 "$S/$tag.log")"
        return 1
    fi
}

# SIGTERM raised by the rank itself at the start of step 3 (GPT_FAULT=signal): the step ends,
# step 3 is saved, the job exits 0; --resume ends as the clean run.
GPT_FAULT=signal@3 run "$P1" 1 sigterm --ckpt-dir "$S/ck-sigterm" --save "$S/sigterm.safetensors"
stopped sigterm sigterm 3 $? && [ ! -e "$S/sigterm.safetensors" ] && pass sigterm
RESUME_FROM=3 resumed sigterm-resume "$P1" 1 sigterm clean1 --ckpt-dir "$S/ck-sigterm"

# Without --ckpt-dir there is nothing to resume from: the signal still ends the step, --save is
# written, and the job exits 1 saying so.
GPT_FAULT=signal@3 run "$P1" 1 sig-nockpt --save "$S/sig-nockpt.safetensors"
rc=$?
if [ $rc = 1 ] && [ -s "$S/sig-nockpt.safetensors" ] &&
   grep -q "^train: stopped by SIGTERM after step 3 of $STEPS: no --ckpt-dir, so no checkpoint\
 to resume from; writing --save$" "$S/sig-nockpt.log"; then
    pass signal-without-ckpt-dir
else
    fail signal-without-ckpt-dir "status $rc: $(grep -m1 "stopped" "$S/sig-nockpt.log")"
fi

# --exit-signal picks the signals: SIGUSR2 only; and "none" leaves SIGTERM's default action
GPT_FAULT=signal@2 run "$P1" 1 sigusr2 --ckpt-dir "$S/ck-sigusr2" --exit-signal USR2
stopped exit-signal sigusr2 2 $? && grep -q "^stopped by SIGUSR2" "$S/sigusr2.log" &&
    pass exit-signal
(GPT_FAULT=signal@2 run "$P1" 1 signone --ckpt-dir "$S/ck-signone" --exit-signal none) \
    2> /dev/null     # no "Terminated" from bash
rc=$?
if [ $rc = 143 ] && [ ! -e "$S/ck-signone/step_00000002" ]; then pass exit-signal-none
else fail exit-signal-none "status $rc, want 143 (killed by SIGTERM, nothing saved)"
fi

# --exit-interval 3 (Megatron's): saved after step 3, exit 0; resumed to the end
run "$P1" 1 interval --ckpt-dir "$S/ck-interval" --exit-interval 3
stopped exit-interval interval 3 $? && pass exit-interval
RESUME_FROM=3 resumed exit-interval-resume "$P1" 1 interval clean1 --ckpt-dir "$S/ck-interval"

# --exit-duration-in-mins 1e-9: over at once, so the first step is the last
run "$P1" 1 duration --ckpt-dir "$S/ck-duration" --exit-duration-in-mins 1e-9
stopped exit-duration duration 1 $? && grep -q "^stopped by --exit-duration-in-mins" \
    "$S/duration.log" && pass exit-duration

# A second signal while the checkpoint is being written (stalled by GPT_FAULT=stall_ckpt at its
# first point): the rank stops at once, status 128 + 15, and the incomplete checkpoint is ignored.
# The rank writes step 3's log line, then starts the checkpoint and stalls at its first point
# (before step_00000003.tmp exists), for a minute: the signal comes 0.2 s after that line.
(GPT_FAULT=signal@3,stall_ckpt@1 run "$P1" 1 second --ckpt-dir "$S/ck-second"
 echo $? > "$S/second.rc") &
second=$!
for _ in $(seq 200); do grep -q '^{"step":3,' "$S/second.jsonl" 2> /dev/null && break; sleep 0.05
done
sleep 0.2
pkill -TERM -f "^$P1 "
wait $second
if [ "$(cat "$S/second.rc")" = 143 ] &&
   grep -q "^train: rank 0: a second signal: stopping now, without a checkpoint" "$S/second.log" &&
   [ ! -e "$S/ck-second/step_00000003" ]; then
    pass second-signal
    RESUME_FROM=none resumed second-signal-resume "$P1" 1 second clean1 --ckpt-dir "$S/ck-second"
else
    fail second-signal "status $(cat "$S/second.rc"), want 143: $(tail -n 1 "$S/second.log")"
fi

# --exit-grace 1 with a checkpoint that would take a minute: aborted after a second
SECONDS=0
GPT_FAULT=signal@3,stall_ckpt@1 run "$P1" 1 grace --ckpt-dir "$S/ck-grace" --exit-grace 1
rc=$?
if [ $rc = 1 ] && [ $SECONDS -lt 20 ] &&
   grep -q "^train: rank 0: --exit-grace 1 s ran out: stopping now" "$S/grace.log"; then
    pass exit-grace
else
    fail exit-grace "status $rc after ${SECONDS}s, want 1 within 20 s: $(tail -n 1 "$S/grace.log")"
fi

# Several ranks: SIGTERM sent to every rank at once (as Slurm does to each task) in the middle
# of the run, and SIGUSR1 sent to mpirun (which passes it on); both resume bit-exactly. The run
# has PSTEPS steps and is signalled once its log shows 5: the 35 left are far more than the
# steps a rank can make while pkill starts, and the resumed run then trains 30 or more steps
# from the checkpoint (each is compared, log and weights, with the clean run's).
PSTEPS=40
preempt() {
    local name=$1 target=$2 sig=$3
    rm -rf "$S/ck-$name"
    (run "$P4" 4 "$name" --ckpt-dir "$S/ck-$name" --steps $PSTEPS --decay-steps $PSTEPS \
         --save "$S/$name.safetensors"; echo $? > "$S/$name.rc") &
    local n job=$!
    for _ in $(seq 600); do
        n=$(grep -c '"step"' "$S/$name.jsonl" 2> /dev/null)
        [ "${n:-0}" -ge 5 ] && break
        sleep 0.05
    done
    pkill "-$sig" -f "$target"
    wait $job
    local at
    at=$(sed -n "s/^stopped by SIG$sig after step \([0-9]*\) of $PSTEPS: saved .*/\1/p" \
         "$S/$name.log")
    if [ "$(cat "$S/$name.rc")" != 0 ] || [ -z "$at" ]; then
        fail "$name" "status $(cat "$S/$name.rc"), no 'stopped by SIG$sig' line: $(tail -n 2 \
            "$S/$name.log" | tr '\n' ' ')"
        return
    fi
    pass "$name"
    # the clean run to $PSTEPS steps, once
    if [ ! -f "$S/clean$PSTEPS.safetensors" ]; then
        run "$P4" 4 clean$PSTEPS --steps $PSTEPS --decay-steps $PSTEPS \
            --save "$S/clean$PSTEPS.safetensors" > /dev/null 2>&1
    fi
    RESUME_FROM=none resumed "$name-resume" "$P4" 4 "$name" clean$PSTEPS --ckpt-dir "$S/ck-$name" \
        --steps $PSTEPS --decay-steps $PSTEPS
}
if [ -n "$P4" ]; then
    preempt preempt-ranks "^$P4 " TERM
    preempt preempt-mpirun "^mpirun .*$P4 " USR1
fi

# -- 5. Bad numbers ------------------------------------------------------------------------------

# A NaN gradient at step 3: the job stops (status 1) naming the step, the rank and the tensor;
# nothing after step 2 was applied (its checkpoint at step 2 resumes to the clean run).
GPT_FAULT=nan_grad@3 run "$P1" 1 nan --ckpt-dir "$S/ck-nan" --ckpt-every 2 > /dev/null 2>&1
rc=$?
if [ $rc = 1 ] &&
   grep -q "^train: error: step 3: loss [0-9.]*, gradient norm nan: not finite; stopping\
 (--skip-bad-steps N skips such steps); the parameters and optimizer state are those before\
 step 3$" "$S/nan.log" &&
   grep -q "^train: rank 0 (stage 0, tp 0, dp 0): the first gradient that is not finite is\
 [a-z_.0-9]*, element 0 of this rank's part: nan$" "$S/nan.log"; then
    pass nan-stops
    RESUME_FROM=2 resumed nan-resume "$P1" 1 nan clean1 --ckpt-dir "$S/ck-nan" --ckpt-every 2
else
    fail nan-stops "status $rc: $(grep -m2 train: "$S/nan.log" | tr '\n' ' ')"
fi

# An infinite loss: stopped the same way, and "every gradient is finite" (none is poisoned)
GPT_FAULT=inf_loss@2 run "$P1" 1 inf > /dev/null 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "^train: error: step 2: loss inf, gradient norm" "$S/inf.log" &&
   grep -q "^train: every gradient is finite: the loss alone is not$" "$S/inf.log"; then
    pass inf-loss-stops
else
    fail inf-loss-stops "status $rc: $(grep -m2 train: "$S/inf.log" | tr '\n' ' ')"
fi

# --skip-bad-steps 2: steps 3 (NaN gradient) and 5 (infinite loss) are skipped and logged; a
# skipped step changes neither the parameters nor the optimizer state (the checkpoints after
# steps 2 and 3 hold the same state bytes) and does not advance the schedule or Adam's step
# count (step 4 runs at step 3's rate); a third bad step stops the job.
GPT_FAULT=nan_grad@3,inf_loss@5 run "$P1" 1 skip --skip-bad-steps 2 --ckpt-dir "$S/ck-skip" \
    --ckpt-every 1 --save "$S/skip.safetensors" > /dev/null 2>&1
rc=$?
lr() { sed -n "s/^{\"step\":$1,.*\"lr\":\([^,]*\),.*/\1/p" "$S/skip.jsonl"; }
if [ $rc != 0 ]; then fail skip-bad-steps "status $rc: $(first_error "$S/skip.log")"
elif [ "$(grep -c '"skipped":true' "$S/skip.jsonl")" != 2 ] ||
     ! grep -q '^{"step":3,"loss":[0-9.]*,"lr":[^,]*,"grad_norm":null,.*"skipped":true}$' \
        "$S/skip.jsonl" ||
     ! grep -q '^{"step":5,"loss":null,.*"skipped":true}$' "$S/skip.jsonl"; then
    fail skip-bad-steps "the log does not show steps 3 and 5 skipped: $(grep -c skipped \
        "$S/skip.jsonl")"
elif ! cmp -s <(state "$S/ck-skip/step_00000002/rank_00000.bin") \
              <(state "$S/ck-skip/step_00000003/rank_00000.bin"); then
    fail skip-bad-steps "the skipped step 3 changed the parameters or optimizer state"
elif [ "$(lr 3)" != "$(lr 4)" ] || [ "$(lr 5)" != "$(lr 6)" ]; then
    fail skip-bad-steps "a skipped step advanced the schedule: lr $(lr 3) $(lr 4) $(lr 5) $(lr 6)"
else
    pass skip-bad-steps
fi
GPT_FAULT=nan_grad@2,nan_grad@4,nan_grad@6 run "$P1" 1 skip3 --skip-bad-steps 2 \
    > /dev/null 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "^train: error: step 6: .*(more than --skip-bad-steps such steps)" \
        "$S/skip3.log"; then pass skip-bad-steps-limit
else fail skip-bad-steps-limit "status $rc: $(first_error "$S/skip3.log")"
fi

# A skipped step is resumed bit-exactly too (the checkpoint keeps the updates and skips made):
# stop the skipping run after step 4 and resume it; it must end as the uninterrupted one.
rm -rf "$S/ck-skipr"
GPT_FAULT=nan_grad@3,inf_loss@5 run "$P1" 1 skipr --skip-bad-steps 2 --ckpt-dir "$S/ck-skipr" \
    --exit-interval 4 > /dev/null 2>&1
GPT_FAULT=inf_loss@5 RESUME_FROM=4 resumed skip-resume "$P1" 1 skipr skip --skip-bad-steps 2 \
    --ckpt-dir "$S/ck-skipr"

# Several ranks: a NaN in rank 2's part only (PP 2 DP 2 with the distributed optimizer, after
# the reduce-scatter): every rank stops, and the message names rank 2 and its tensor.
if [ -n "$P4" ]; then
    GPT_FAULT=nan_grad@2:2 run "$P4" 4 nan4 > /dev/null 2>&1
    rc=$?
    if [ $rc != 0 ] && grep -q "^train: error: step 2: .*gradient norm nan" "$S/nan4.log" &&
       grep -q "^train: rank 2 (stage 1, tp 0, dp 0): the first gradient that is not finite is" \
            "$S/nan4.log"; then
        pass nan-rank
    else
        fail nan-rank "status $rc: $(grep -m2 "train:" "$S/nan4.log" | tr '\n' ' ')"
    fi
fi

# A bad GPT_FAULT is a usage error, not a silent clean run
GPT_FAULT=nan_grad@0 run "$P1" 1 badfault > /dev/null 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "^train: error: GPT_FAULT='nan_grad@0': expected KIND@N\[:RANK\]" \
        "$S/badfault.log"; then pass bad-fault-spec
else fail bad-fault-spec "status $rc: $(first_error "$S/badfault.log")"
fi

# -- 6. Checkpoints that know what wrote them; one job per checkpoint directory ----------------
#
# A resume checkpoint records its program (the model's text, the layout's, the rank) and a
# checksum (lib/ckpt.c, README.md "Resume checkpoints"): --resume refuses, every rank alike, a
# file of another layout or model or a damaged one, naming the difference; version 3 files
# still load, with a warning. Rank 0 holds --ckpt-dir/LOCK for the run: a second job on the
# same directory stops before training, naming the holder; a killed job's lock does not stay.

# refused NAME TAG WANT PROG WORLD ARGS...: PROG --resume with ARGS stops before any step with
# status 1 and the first error line WANT (a bash pattern: * and [...] match; the messages
# hold no other pattern characters).
refused() {
    local name=$1 tag=$2 want=$3 prog=$4 world=$5 got
    shift 5
    run "$prog" "$world" "$tag" --resume "$@" > /dev/null 2>&1
    local rc=$?
    got=$(grep -m1 "error:" "$S/$tag.log")
    if [ $rc != 1 ]; then
        fail "$name" "status $rc, want 1: $(grep -m1 -e "error:" -e "^resumed" "$S/$tag.log")"
    elif [[ $got != $want ]]; then fail "$name" "got '$got'"
    elif grep -q "^resumed from" "$S/$tag.log" || [ -s "$S/$tag.jsonl" ]; then
        fail "$name" "it resumed or ran a step before the error"
    else pass "$name"
    fi
}
# flip FILE: XOR 0x40 into a byte of FILE's state (4 KiB before its end)
flip() {
    local off b
    off=$(($(stat -c %s "$1") - 4096))
    b=$(od -An -tu1 -j "$off" -N1 "$1" | tr -d ' ')
    printf "$(printf '\\%03o' $((b ^ 0x40)))" | dd of="$1" bs=1 seek="$off" conv=notrunc \
        status=none
}
HINT="; resume with the program that wrote it"

# Another rank order, the same sizes: each rank's shards would be another rank's
if have_mpi; then
    build order-a --tp 2 --dp 2
    build order-b --tp 2 --dp 2 --order dp-tp-cp-ep-pp
    rm -rf "$S/ck-order"
    if run "$S/order-a/train" 4 order-a --ckpt-dir "$S/ck-order" --exit-interval 4 \
            > /dev/null 2>&1; then
        refused ckpt-other-order order-b "$S/ck-order/step_00000004/rank_00000.bin: error:\
 written by a different layout: order tp-cp-ep-dp-pp there, dp-tp-cp-ep-pp here$HINT (make\
 MODEL=tiny TP=2 PP=1 DP=2), or start this layout from it with --reshard-from and another\
 --ckpt-dir" "$S/order-b/train" 4 \
            --ckpt-dir "$S/ck-order"
    else
        fail ckpt-other-order "the tp2 dp2 run failed: $(first_error "$S/order-a.log")"
    fi
fi

# Another model of the same bytes (tests/models/tiny_v128_t192.lua: wte's rows would be wpe's)
if ! gen_build "$S/other-model" tests/models/tiny_v128_t192.lua; then
    fail ckpt-other-model "$WHY"
elif ! build/ref/make_tokens --vocab 128 --tokens 20000 "$S/tok128.bin" > "$S/tok128.log" 2>&1
then
    fail ckpt-other-model "cannot make the token file of vocabulary 128"
elif ! run "$P1" 1 model-a --ckpt-dir "$S/ck-model" --exit-interval 4 > /dev/null 2>&1; then
    fail ckpt-other-model "the tiny run failed: $(first_error "$S/model-a.log")"
else
    refused ckpt-other-model model-b "$S/ck-model/step_00000004/rank_00000.bin: error:\
 written by a different model: seq_len 64 there, 192 here$HINT (make MODEL=tiny TP=1 PP=1\
 DP=1), or give this run another --ckpt-dir" "$S/other-model/train" 1 \
        --data "$S/tok128.bin" --ckpt-dir "$S/ck-model"
fi

# A flipped bit in the state: damaged, named; moved aside, the checkpoint before it resumes
rm -rf "$S/ck-flip" "$S/flip-aside"
mkdir -p "$S/ck-flip"
cp -r "$S/ck-clean1/step_00000002" "$S/ck-clean1/step_00000004" "$S/ck-flip/"
flip "$S/ck-flip/step_00000004/rank_00000.bin"
refused ckpt-damaged flip "$S/ck-flip/step_00000004/rank_00000.bin: error: damaged: its\
 checksum does not match (XXH3-64 written *, read *): its bytes changed on the disk or\
 on the way; to resume from the checkpoint before it, move $S/ck-flip/step_00000004 aside" \
    "$P1" 1 --ckpt-dir "$S/ck-flip"
mv "$S/ck-flip/step_00000004" "$S/flip-aside"
cp "$S/clean1.jsonl" "$S/flip.jsonl"       # its steps 1 and 2 stay (the resumed run's log)
RESUME_FROM=2 resumed ckpt-damaged-aside "$P1" 1 flip clean1 --ckpt-dir "$S/ck-flip"

# ... in one rank's file of four: every rank stops (status 1, no hang), the message names it
if [ -n "$P4" ]; then
    rm -rf "$S/ck-flip4"
    mkdir -p "$S/ck-flip4"
    cp -r "$S/ck-clean4/step_00000004" "$S/ck-flip4/"
    flip "$S/ck-flip4/step_00000004/rank_00003.bin"
    refused ckpt-damaged-rank3 flip4 "$S/ck-flip4/step_00000004/rank_00003.bin: error:\
 damaged: its checksum does not match*" "$P4" 4 --ckpt-dir "$S/ck-flip4"
fi

# A version 3 file (the header's first 8 words, then the state) loads, with a warning
rm -rf "$S/ck-v3"
mkdir -p "$S/ck-v3/step_00000004"
f4=$S/ck-clean1/step_00000004/rank_00000.bin
{ printf GPTPCKT3; head -c 64 "$f4" | tail -c 56; state "$f4"; } \
    > "$S/ck-v3/step_00000004/rank_00000.bin"
cp "$S/clean1.jsonl" "$S/v3.jsonl"
RESUME_FROM=4 resumed ckpt-version3 "$P1" 1 v3 clean1 --ckpt-dir "$S/ck-v3"
grep -q "^$S/ck-v3/step_00000004: warning: a version 3 checkpoint records no model or layout:\
 only its world, stage and size are checked; resume it only with the program that wrote it$" \
    "$S/v3.log" || fail ckpt-version3-warning "no warning: $(head -n 2 "$S/v3.log" | tr '\n' ' ')"

# Two jobs on one --ckpt-dir: the second stops before training, naming the first (host, pid,
# start time); once the first is killed (-9), its lock is gone and a third job runs.
rm -rf "$S/ck-lock"
"$P1" "${HP[@]}" --log "$S/lock-a.jsonl" --ckpt-dir "$S/ck-lock" --steps 100000 \
    --decay-steps 100000 > "$S/lock-a.log" 2>&1 < /dev/null &
apid=$!
for _ in $(seq 400); do grep -q "pid" "$S/ck-lock/LOCK" 2> /dev/null && break; sleep 0.05; done
refused ckpt-lock lock-b "$S/ck-lock/LOCK: error: another job is using this checkpoint\
 directory (host $(hostname), pid $apid, started [0-9-]*T[0-9:]*Z); one job per --ckpt-dir:\
 wait for it to end, or give this run another --ckpt-dir; nothing was run" \
    "$P1" 1 --ckpt-dir "$S/ck-lock"
kill -KILL $apid
{ wait $apid; } 2> /dev/null
run "$P1" 1 lock-c --ckpt-dir "$S/ck-lock" --ckpt-every 4 > /dev/null 2>&1
rc=$?
cpid=$(sed -n 's/^host .*, pid \([0-9]*\), started .*/\1/p' "$S/ck-lock/LOCK" 2> /dev/null)
if [ $rc != 0 ] || [ ! -d "$S/ck-lock/step_00000008" ]; then
    fail ckpt-lock-stale "status $rc after the holder's kill -9: $(first_error "$S/lock-c.log")"
elif [ -z "$cpid" ] || [ "$cpid" = $apid ]; then
    fail ckpt-lock-stale "the third job did not take the lock: $(cat "$S/ck-lock/LOCK")"
else pass ckpt-lock-stale
fi

# A --ckpt-dir that is not one directory for every rank (here: rank 1 in a mount namespace of
# its own, a tmpfs over the directory, as on a node that does not mount the shared file
# system) stops the job before training, naming the rank. Needs root's unshare and mount.
cat > "$S/private.sh" << 'SH'
#!/bin/bash
if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then
    exec unshare -m bash -c 'mount -t tmpfs none "$0" && exec "$@"' "$PRIVATE_DIR" "$@"
fi
exec "$@"
SH
chmod +x "$S/private.sh"
mkdir -p "$S/ck-private"
if [ -z "$P4" ]; then skip ckpt-not-shared "needs mpirun (make deps)"
elif ! unshare -m bash -c "mount -t tmpfs none '$S/ck-private'" 2> /dev/null; then
    skip ckpt-not-shared "cannot make a mount namespace here (needs root: unshare -m, mount)"
else
    PRIVATE_DIR=$S/ck-private RUN_TIMEOUT=120 run_prog "$S/private.sh" 4 "$S/private.log" \
        "$P4" "${HP[@]}" --ckpt-dir "$S/ck-private" > /dev/null 2>&1
    rc=$?
    want="$S/ck-private: error: rank 1 does not see the lock file rank 0 wrote in it: --ckpt-dir\
 must be one directory every rank sees (a file system shared by all nodes: rank 0 renames the\
 ranks' checkpoint files into place); nothing was run"
    if [ $rc = 0 ]; then fail ckpt-not-shared "the job ran"
    elif [ "$(grep -m1 'error:' "$S/private.log")" != "$want" ]; then
        fail ckpt-not-shared "got '$(grep -m1 'error:' "$S/private.log")'"
    elif grep -q '^step' "$S/private.log" || ls -d "$S"/ck-private/step_* > /dev/null 2>&1; then
        fail ckpt-not-shared "a step ran or a checkpoint was written"
    else pass ckpt-not-shared
    fi
fi

# -- The kill verdicts (section 3, run beside 4 and 5), then sections 4 and 5 -------------------
exec 1>&9 9>&-
wait $kill1
cat "$S/kill-p1.verdicts"
if [ -n "$P4" ]; then
    wait $kill4
    cat "$S/kill-p4.verdicts"
fi
cat "$S"/kill-*.summary >> "$S/summary.txt" 2> /dev/null
grep -q '^FAIL ' "$S/kill-p1.verdicts" "$S/kill-p4.verdicts" 2> /dev/null && FAILED=1
cat "$S/later.out"
finish
