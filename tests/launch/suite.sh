#!/bin/bash
# tests/launch/suite.sh: make sbatch / gen --sbatch (gen/lua/launch.lua): the Slurm batch script
# of a layout, its refusals, and, where Debian's slurm-wlm is installed and this is root, the
# script run for real: a one-machine cluster (slurmctld and slurmd of this suite's own, on
# ports of their own) runs it for tiny TP 2 DP 2 on the CPU, sends the time limit's warning
# (scancel --batch --signal=USR1) mid-run, and the requeued job must finish with the weights
# and log (timings aside) of an uninterrupted run, bit for bit.
. "$(dirname "$0")/../lib.sh" launch

if ! make -s --no-print-directory build/gen > "$S/make.log" 2>&1; then
    fail build "make build/gen: $(first_error "$S/make.log")"
    finish
fi

# -- Refusals: the message, status 1, nothing printed on stdout ------------------------------
refuse() {
    local name=$1 want=$2
    shift 2
    build/gen tiny --tp 2 --dp 2 --sbatch "$@" > "$S/$name.out" 2> "$S/$name.err"
    local rc=$?
    if [ $rc != 1 ]; then fail "err-$name" "status $rc, want 1"
    elif [ "$(head -n 1 "$S/$name.err")" != "gen: error: $want" ]; then
        fail "err-$name" "got '$(head -n 1 "$S/$name.err")'"
    elif [ -s "$S/$name.out" ]; then fail "err-$name" "a script was printed"
    else pass "err-$name"; fi
}
refuse no-nodes "--sbatch needs --nodes N and --tasks-per-node N (NODES=, GPUS_PER_NODE=)"
refuse world "2 nodes x 4 ranks per node = 8 ranks, but the layout has 4 (tp2 pp1 dp2):\
 choose NODES x GPUS_PER_NODE = 4" --nodes 2 --tasks-per-node 4
refuse tp-across "TP group 0 (ranks 0..1) spans two nodes of 1 ranks: tensor parallelism must\
 stay inside a node (GPUS_PER_NODE a multiple of TP 2, and tp first in the rank order)" \
    --nodes 4 --tasks-per-node 1
refuse order "TP group 0 (ranks 0..2) spans two nodes of 2 ranks: tensor parallelism must stay\
 inside a node (GPUS_PER_NODE a multiple of TP 2, and tp first in the rank order)" \
    --nodes 2 --tasks-per-node 2 --order dp-tp-cp-ep-pp
refuse time "--time 5h: a Slurm time limit as [D-]HH:MM:SS" --nodes 1 --tasks-per-node 4 \
    --time 5h
refuse warn "--warn 5: seconds of warning before the time limit, 10..65535 (Slurm's --signal)" \
    --nodes 1 --tasks-per-node 4 --warn 5
refuse backend "--backend rocm: cuda or cpu" --nodes 1 --tasks-per-node 4 --backend rocm
refuse quote "--train-args: '\$(x)' holds characters a batch script would have to quote\
 (letters, digits and -_./=,:+@% only)" --nodes 1 --tasks-per-node 4 --train-args '--data $(x)'
refuse own-flag "--train-args: --ckpt-dir is set by CKPT_DIR= (--ckpt-dir)" --nodes 1 \
    --tasks-per-node 4 --train-args '--ckpt-dir x'

# -- The script: what Slurm reads ------------------------------------------------------------
if build/gen tiny --tp 2 --dp 2 --sbatch --nodes 1 --tasks-per-node 4 --partition gpu \
        --time 1-00:00:00 --warn 300 --train-args "--data d.bin --steps 9" > "$S/cuda.sbatch" \
        2> "$S/cuda.err" &&
   bash -n "$S/cuda.sbatch" &&
   [ "$(grep '^#SBATCH' "$S/cuda.sbatch" | tr '\n' ' ')" = "#SBATCH --job-name=gen-tiny-tp2-pp1-dp2\
 #SBATCH --nodes=1 #SBATCH --ntasks-per-node=4 #SBATCH --gpus-per-node=4\
 #SBATCH --time=1-00:00:00 #SBATCH --partition=gpu #SBATCH --signal=B:USR1@300\
 #SBATCH --requeue #SBATCH --open-mode=append\
 #SBATCH --output=out/tiny-tp2-pp1-dp2/slurm-%j.out " ] &&
   grep -qxF "srun --mpi=pmix --kill-on-bad-exit=1 out/tiny-tp2-pp1-dp2/train_cuda --ckpt-dir\
 ckpt/tiny-tp2-pp1-dp2 --resume --exit-signal SIGUSR1,SIGTERM --data d.bin --steps 9 &" \
        "$S/cuda.sbatch" &&
   # Slurm reads directives up to the first command: none may follow one
   awk '/^#SBATCH/ { if (cmd) exit 1 } /^[^#]/ { cmd = 1 }' "$S/cuda.sbatch"; then
    pass script
else
    fail script "$(head -n 1 "$S/cuda.err") (see $S/cuda.sbatch)"
fi

# -- For real, on a cluster of this machine --------------------------------------------------
if [ "$(id -u)" != 0 ] || ! command -v slurmctld > /dev/null || ! command -v slurmd > /dev/null ||
   ! command -v sbatch > /dev/null; then
    skip slurm-requeue "needs root and Debian's slurm-wlm (apt-get install slurm-wlm)"
    finish
fi
if ! have_mpi; then skip slurm-requeue "needs mpirun (make deps)"; finish; fi
if ! gen_build "$S/p" tiny --tp 2 --dp 2 > /dev/null 2>&1; then
    fail slurm-requeue "$WHY"
    finish
fi
if ! make -s --no-print-directory build/ref/make_tokens > "$S/make.log" 2>&1 ||
   ! build/ref/make_tokens --vocab 256 --tokens 40000 --seed 9 "$S/tok.bin" > /dev/null 2>&1
then
    fail slurm-requeue "cannot make the token file: $(first_error "$S/make.log")"
    finish
fi
STEPS=400
TA=(--data "$S/tok.bin" --steps $STEPS --decay-steps $STEPS --quiet)
# the uninterrupted run
if ! RUN_TIMEOUT=120 run_prog "$S/p/train" 4 "$S/ref.log" "${TA[@]}" --log "$S/ref.jsonl" \
        --save "$S/ref.safetensors"; then
    fail slurm-requeue "the uninterrupted run failed: $(first_error "$S/ref.log")"
    finish
fi

# the cluster: this host, 8 CPUs (slurmd told so), ports of this run's own
SL=$(cd "$S" && pwd)/slurm
mkdir -p "$SL/state" "$SL/spool"
# ports below Linux's ephemeral range (32768 up), where this run's own MPI connections could
# hold them; a port taken already ends slurmctld at once, and the next pair is tried
write_conf() {
cat > "$SL/slurm.conf" << CONF
ClusterName=gentest
SlurmctldHost=$(hostname -s)
SlurmctldPort=$1
SlurmdPort=$(($1 + 1))
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$SL/state
SlurmdSpoolDir=$SL/spool
SlurmctldPidFile=$SL/slurmctld.pid
SlurmdPidFile=$SL/slurmd.pid
SlurmctldLogFile=$SL/slurmctld.log
SlurmdLogFile=$SL/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmix
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
NodeName=$(hostname -s) CPUs=8 State=UNKNOWN
PartitionName=test Nodes=$(hostname -s) Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
}
export SLURM_CONF=$SL/slurm.conf
stop_cluster() {
    [ -f "$SL/slurmd.pid" ] && kill "$(cat "$SL/slurmd.pid")" 2> /dev/null
    [ -f "$SL/slurmctld.pid" ] && kill "$(cat "$SL/slurmctld.pid")" 2> /dev/null
}
trap stop_cluster EXIT
# NAME's pid file is there and its process is not (it ended: slurmctld on a taken port)
ended() { [ -f "$SL/$1.pid" ] && ! kill -0 "$(cat "$SL/$1.pid")" 2> /dev/null; }
up=""
for try in 0 1 2 3 4; do
    stop_cluster
    rm -f "$SL/slurmctld.pid" "$SL/slurmd.pid"
    write_conf $((10000 + (($$ + try * 7919) % 11000) * 2))
    slurmctld -i -f "$SLURM_CONF" > "$SL/start.log" 2>&1 &&
        slurmd -f "$SLURM_CONF" >> "$SL/start.log" 2>&1
    # up to 15 s (sinfo bounded: it waits on a port that accepts and does not answer), given
    # up when slurmctld has ended
    deadline=$((SECONDS + 15))
    while [ $SECONDS -lt $deadline ]; do
        timeout 2 sinfo -h -o %T 2> /dev/null | grep -q idle && { up=1; break; }
        sleep 0.2
        ended slurmctld && break
    done
    [ -n "$up" ] && break
done
if [ -z "$up" ]; then
    skip slurm-requeue "the cluster did not start here ($(tail -n 1 "$SL/slurmctld.log" 2> /dev/null))"
    finish
fi

# the job: the script as make sbatch writes it
if ! build/gen tiny --tp 2 --dp 2 --out "$S/p" --sbatch --nodes 1 --tasks-per-node 4 \
        --backend cpu --ckpt-dir "$S/ck" --time 0:10:00 \
        --train-args "${TA[*]} --log $S/job.jsonl --save $S/job.safetensors" \
        > "$S/job.sbatch" 2> "$S/job.err"; then
    fail slurm-requeue "gen --sbatch: $(head -n 1 "$S/job.err")"
    finish
fi
id=$(sbatch --parsable "$S/job.sbatch" 2> "$S/sbatch.err")
state() { squeue -h -j "$id" -o %T 2> /dev/null; }
# the warning once three steps are logged, then the requeued job let start at once
for _ in $(seq 600); do
    [ -f "$S/job.jsonl" ] && [ "$(wc -l < "$S/job.jsonl")" -ge 3 ] && break
    sleep 0.05
done
scancel --batch --signal=USR1 "$id"
for _ in $(seq 600); do [ "$(state)" = PENDING ] && break; sleep 0.05; done
scontrol update JobId="$id" StartTime=now > /dev/null 2>&1
for _ in $(seq 1200); do [ -z "$(state)" ] && break; sleep 0.1; done
out=$S/p/slurm-$id.out
if [ -n "$(state)" ]; then
    scancel "$id"
    fail slurm-requeue "the job did not end (state $(state)); $out"
elif ! grep -q "^stopped by SIGUSR1 after step [0-9]* of $STEPS: saved $S/ck/step_" "$out" ||
     ! grep -q "requeued" "$out" || ! grep -q "^resumed from $S/ck/step_" "$out"; then
    fail slurm-requeue "no stop, requeue and resume in $out: $(grep -m1 -e error -e stopped "$out")"
elif ! cmp -s "$S/job.safetensors" "$S/ref.safetensors" ||
     ! diff <(sed 's/,"ms":.*//' "$S/job.jsonl") <(sed 's/,"ms":.*//' "$S/ref.jsonl") \
        > "$S/diff.log"; then
    fail slurm-requeue "the requeued job's weights or log differ from the uninterrupted run's"
else
    pass slurm-requeue
fi
finish
