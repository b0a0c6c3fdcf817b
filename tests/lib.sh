# tests/lib.sh: what every test suite shares (docs/DESIGN.md §3). A suite is a bash script,
# tests/<suite>/suite.sh, that starts with
#
#     . "$(dirname "$0")/../lib.sh" <suite>
#
# which moves to the repository root and empties its scratch directory $S (build/test/<suite>,
# or $TEST_SCRATCH/<suite> to run beside another make test). Then:
#
#   pass T / fail T WHY / skip T WHY   print "PASS <suite>/T", "FAIL <suite>/T: WHY", "SKIP ..."
#   finish                             exit 1 if anything failed, else 0
#   first_error LOG                    the first line of LOG that looks like an error
#   MPIRUN                             mpirun for root or not, oversubscribed, shared memory
#   run_prog PROG WORLD LOG ARGS...    PROG on WORLD ranks (directly when 1), bounded in time
#   gen_build DIR GEN-ARGS...          generate into DIR and build DIR/train ($TARGET)
#   world_of DIR                       the world size in DIR/topology.json
#   cuda_backend, have_gpu             whether train_cuda builds here; whether a GPU is present
#   equiv TABLE [--cuda]               the equivalence runner (below)
#
# STCOMPARE (tools/stcompare) and LOGCMP (tests/logcmp.lua) are the one weight comparer and the
# one log comparer every suite uses.

SUITE=$1
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
S=${TEST_SCRATCH:-build/test}/$SUITE
rm -rf "$S"
mkdir -p "$S"
FAILED=0
STCOMPARE=build/tools/stcompare
LOGCMP="lua5.4 tests/logcmp.lua"

pass() { echo "PASS $SUITE/$1"; }
fail() { echo "FAIL $SUITE/$1: $2"; FAILED=1; }
skip() { echo "SKIP $SUITE/$1: $2"; }
finish() { exit $FAILED; }

first_error() {
    grep -m1 -E 'error|Error|FAIL|abort|^\[rank' "$1" 2> /dev/null | cut -c1-200
}

# MPI's settings for the tests: TEST_MCA (mpirun's options) and the environment (tests/mpi.sh;
# tests/run.sh found them once for every suite).
. tests/mpi.sh
MPIRUN="mpirun --oversubscribe $TEST_MCA"
# the tokens tests/run.sh shares among the suites (fd 8; tests/lib.sh, equiv), when under it
if [ -n "$TEST_TOKENS" ] && ! { true >&8; } 2> /dev/null; then TEST_TOKENS=""; fi
[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
have_mpi() { command -v mpirun > /dev/null 2>&1; }

# run_prog PROG WORLD LOG ARGS...: PROG under mpirun on WORLD ranks (directly when 1), stdin
# closed, output in LOG, stopped after RUN_TIMEOUT seconds (default 300).
run_prog() {
    local prog=$1 world=$2 log=$3
    shift 3
    if [ "$world" = 1 ]; then
        timeout "${RUN_TIMEOUT:-300}" "$prog" "$@" > "$log" 2>&1 < /dev/null
    else
        timeout "${RUN_TIMEOUT:-300}" $MPIRUN -np "$world" "$prog" "$@" > "$log" 2>&1 < /dev/null
    fi
}

# gen_build DIR GEN-ARGS...: build/gen GEN-ARGS into DIR, then make DIR/$TARGET (default train;
# objects in DIR.obj). Logs: DIR.gen.log, DIR.build.log. On failure WHY says what went wrong.
gen_build() {
    local dir=$1
    shift
    if [ ! -f "$dir/topology.json" ] &&
       ! build/gen "$@" --out "$dir" > "$dir.gen.log" 2>&1 < /dev/null; then
        WHY="build/gen $*: $(first_error "$dir.gen.log")"
        return 1
    fi
    # shellcheck disable=SC2086 # GEN_MAKEFILES: words (-f Makefile -f tests/kernels/emu.mk)
    if ! make -s --no-print-directory -j2 $GEN_MAKEFILES GEN_DIR="$dir" GEN_OBJ="$dir.obj" \
            "$dir/${TARGET:-train}" > "$dir.build.log" 2>&1 < /dev/null; then
        WHY="building $dir/${TARGET:-train}: $(first_error "$dir.build.log")"
        return 1
    fi
}

world_of() {
    sed -n 's/^{"model": "[^"]*", "world": \([0-9]*\),.*/\1/p' "$1/topology.json"
}

cuda_backend() {
    make -s --no-print-directory echo 2> /dev/null | grep -q 'cuda backend enabled'
}
# torch_python: the first of python3, /usr/bin/python3 that imports torch (empty if none)
torch_python() {
    local p
    for p in python3 /usr/bin/python3; do
        if command -v "$p" > /dev/null 2>&1 && "$p" -c 'import torch' > /dev/null 2>&1; then
            echo "$p"
            return
        fi
    done
}
have_gpu() {
    command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q '^GPU'
}

# -- The equivalence runner ---------------------------------------------------------------------
#
# equiv TABLE [--cuda] reads a table of runs, one per line:
#
#     name | gen args | world | reference | tolerances [| train flags]
#
# * gen args: build/gen's arguments (the program is built once per distinct gen args, into
#   $S/out/<name>), or "gpt2_ref ARGS": the double-precision reference program with ARGS.
# * world: the ranks; must be the world of topology.json (1 for the reference program).
# * reference: "-" (a baseline: run, compared with nothing), or the names of earlier rows this
#   run must match; "!name": a control that must NOT match name (both the log and the weight
#   comparisons must see the difference).
# * tolerances: the name of a set declared by "@tol NAME KEY=TOL... weights=SPEC": log keys
#   compared by tests/logcmp.lua (TOL relative, or exact); weights by tools/stcompare, SPEC
#   "exact" or "ATOL,RTOL" or "ATOL,RTOL,OUTLIERS,HARD" (stcompare --help).
# * train flags: added to the flags of the last "@train FLAGS" line; later flags win.
# $S and $NAME in gen args and flags stand for the scratch directory and the row's name. A line
# ending in a backslash continues on the next; "#" starts a comment.
# Each row's run leaves $S/run/<name>.{log,jsonl,safetensors}; a row that fails to build or
# run, or differs, prints FAIL; a compared row that matches prints PASS; a baseline that runs
# prints nothing. Every comparison's numbers go to $S/summary.txt. Afterwards DIR[name] holds
# a row's program directory and WORLD[name] its world, for the suite's own checks.
#
# With --cuda each row's train_cuda is built (cuda-build-<name>) and, on a machine with a GPU,
# run and compared as above (cuda-run-<name>; runs in $S/run/cuda.<name>.*); without a GPU the
# rows are built only, and without the CUDA backend the table is skipped. With --emu each row's
# train_cuda_emu_mpi (tests/kernels/emu.mk: train_cuda on the CPU emulation of CUDA, its ranks
# sharing the emulated device over the MPI transport) is built and run the same way
# (emu-run-<name>; runs in $S/run/emu.<name>.*), wherever g++ and x86-64 are.

declare -A DIR WORLD TOL BUILT RAN REFPROG

# mem_check LOG: a program's memory plan held (docs/PROGRAM.md §5): the first rank of every
# stage printed "memory: planned P bytes, allocated A bytes (stage S)" with P == A, stages
# 0 .. PP-1 once each. WHY says what is wrong.
mem_check() {
    local bad
    bad=$(awk '/^memory: planned / { n++; s[$9 + 0]++
                   if ($3 != $6) { print "stage " $9 + 0 ": planned " $3 ", allocated " $6; exit } }
               END { if (!n) { print "no memory line"; exit }
                     for (k = 0; k < n; k++) if (s[k] != 1) { print "stage " k " printed " \
                         s[k] + 0 " memory lines"; exit } }' "$1")
    WHY="memory plan: $bad"
    [ -z "$bad" ]
}

# equiv_compare NAME TAG REF RTAG TOLSPEC: compare run TAG with run RTAG (row REF) under the
# tolerances TOLSPEC (a set's TOL[name]); 0 when they match. WHY says how they differ; CAUGHT
# is 1 when every comparison the set asks for saw a difference (what a control needs). The
# numbers go to $SUMMARY (default $S/summary.txt).
equiv_compare() {
    local name=$1 tag=$2 ref=$3 rtag=$4 spec keys="" w="" out a r o h bad=0 lw="" ww=""
    for spec in $5; do
        case $spec in
        weights=exact) w="--exact" ;;
        weights=*)
            IFS=, read -r a r o h <<< "${spec#weights=}"
            w="--atol $a --rtol $r"
            [ -n "$o" ] && w="$w --outliers $o --hard $h" ;;
        *) keys="$keys $spec" ;;
        esac
    done
    CAUGHT=1
    if [ -n "$keys" ]; then
        # shellcheck disable=SC2086 # the keys are words
        if out=$($LOGCMP "$S/run/$tag.jsonl" "$S/run/$rtag.jsonl" $keys 2>&1); then
            CAUGHT=0
        else
            bad=1
        fi
        lw=$(echo "$out" | tail -n 1)
        echo "$name vs $ref: logs: $lw" >> "${SUMMARY:-$S/summary.txt}"
    fi
    if [ -n "$w" ]; then
        # shellcheck disable=SC2086 # the options are words
        if out=$($STCOMPARE -q $w "$S/run/$tag.safetensors" "$S/run/$rtag.safetensors" 2>&1)
        then
            CAUGHT=0
        else
            bad=$((bad | 2))
        fi
        ww=$(echo "$out" | tail -n 1)
        echo "$name vs $ref: weights: $ww" >> "${SUMMARY:-$S/summary.txt}"
    fi
    case $bad in
    0) WHY="logs ($lw) and weights ($ww) match $ref" ;;
    1) WHY="logs differ from $ref: $lw" ;;
    2) WHY="weights differ from $ref: $ww" ;;
    3) WHY="logs and weights differ from $ref: $lw" ;;
    esac
    return $bad
}

# -- Checkpoints, for the suites whose equiv runs left their programs in DIR and WORLD ----------

# ckpt_roundtrip RUN TRAINED NAME...: every named layout loads TRAINED and --save's it back bit
# for bit (RUN NAME TAG ARGS... runs row NAME's program, writing $S/run/TAG.*; here with --init
# TRAINED --steps 0). One verdict, checkpoint-roundtrip; every name must have been built. The
# layouts run side by side (TEST_ROW_JOBS at a time).
ckpt_roundtrip() {
    local run=$1 trained=$2 bad="" n=0 name verdict=${CKPT_VERDICT:-checkpoint-roundtrip}
    shift 2
    pool_start "${TEST_ROW_JOBS:-2}"
    for name in "$@"; do
        [ -n "${DIR[$name]}" ] && [ -f "$trained" ] || continue
        n=$((n + 1))
        rm -f "$S/run/$name.rt.ok"
        pool_add ckpt_roundtrip_one "$run" "$trained" "$name"
    done
    pool_wait
    for name in "$@"; do
        [ -n "${DIR[$name]}" ] && [ -f "$trained" ] || continue
        [ -f "$S/run/$name.rt.ok" ] || bad="$bad $name"
    done
    if [ $n -lt $# ]; then fail "$verdict" "only $n of $# layouts could be checked"
    elif [ -n "$bad" ]; then fail "$verdict" "load + save is not the identity for:$bad"
    else pass "$verdict"; fi
}
ckpt_roundtrip_one() {      # RUN TRAINED NAME: $S/run/NAME.rt.ok when NAME's round trip holds
    tokens_take
    if $1 "$3" "$3.rt" --init "$2" --steps 0 &&
       $STCOMPARE -q --exact "$S/run/$3.rt.safetensors" "$2" > "$S/run/$3.rt.cmp" 2>&1; then
        touch "$S/run/$3.rt.ok"
    fi
    tokens_give
}

# resume_check RUN NAME STEPS: row NAME's program runs STEPS steps straight, and 4 steps with a
# checkpoint after step 3 then --resume to STEPS (RUN as for ckpt_roundtrip; RUN must pass
# --log $S/run/TAG.jsonl and --save $S/run/TAG.safetensors): the log lines (timings aside) and
# the weights must be the same. One verdict, resume (or $RESUME_VERDICT).
resume_check() {
    local run=$1 name=$2 steps=$3 a=(--decay-steps "$3" --ckpt-every 3)
    local resume=${RESUME_VERDICT:-resume}
    if [ -z "${DIR[$name]}" ]; then
        fail "$resume" "$name was not built"
        return
    fi
    rm -rf "$S/ck-full" "$S/ck-part"
    if ! { $run "$name" "$name.full" "${a[@]}" --steps "$steps" --ckpt-dir "$S/ck-full" &&
           $run "$name" "$name.part" "${a[@]}" --ckpt-dir "$S/ck-part" --steps 4 &&
           $run "$name" "$name.part" "${a[@]}" --ckpt-dir "$S/ck-part" --steps "$steps" \
               --resume; } > "$S/resume.log" 2>&1; then
        fail "$resume" "a run of $name failed: $(first_error "$S/run/$name.part.log")"
    elif ! grep -q "resumed from $S/ck-part/step_00000003" "$S/run/$name.part.log"; then
        fail "$resume" "$name did not resume from step 3"
    elif ! diff <(sed 's/,"ms":.*//' "$S/run/$name.part.jsonl") \
                <(sed 's/,"ms":.*//' "$S/run/$name.full.jsonl") > "$S/resume.log" 2>&1 ||
         ! cmp "$S/run/$name.part.safetensors" "$S/run/$name.full.safetensors" \
                >> "$S/resume.log" 2>&1; then
        fail "$resume" "resuming $name is not bit-exact: $(head -n 1 "$S/resume.log")"
    else
        pass "$resume"
    fi
}

# -- Running the rows side by side --------------------------------------------------------------
#
# A row's ranks run one thread each (RT_THREADS=1, unless set): the ranks of a row of several
# get one anyway on 2 cores, and a row of one rank is a reference whose thread count no
# comparison sees (thread-count identity is tests/kernels' and tests/runtime's; tests/train,
# single and faults run one rank with the default threads). A second thread spins 1 ms after
# each parallel loop (runtime/rt_common.c), which, suites side by side, cost a row of one rank
# several times its CPU.
#
# A table is run in four steps, so that its independent work overlaps: read every row (the
# table's own errors found), build every distinct program (TEST_BUILD_JOBS at a time, default
# 2), run the rows and compare each with its references as soon as those have run
# (TEST_ROW_JOBS at a time, default 2: a rank waiting at start-up or in a collective leaves the
# core to another row's), then print the verdicts in the table's order. A row waits for the
# rows it compares with and for those whose files its flags name ($S/run/<name>.*).
# Under tests/run.sh the jobs of every suite also share TEST_TOKENS tokens (a FIFO on fd 8): a
# build or a run takes one while it runs, so that the suites side by side do not run more
# programs at once than the machine takes.

# tokens_take / tokens_give: one token from the shared FIFO, and back (no-ops without it)
tokens_take() { [ -n "$TEST_TOKENS" ] && read -r -n 1 -u 8 _; return 0; }
tokens_give() { [ -n "$TEST_TOKENS" ] && printf x >&8; return 0; }

# pool_start LIMIT: start a pool of background jobs; pool_add FUNC ARGS...: run FUNC ARGS in the
# background, once fewer than LIMIT run; pool_wait: until all have ended; pool_reap: until one
# has. A job reports through files (its output is its own).
declare -A POOL_PID
POOL_LIMIT=2
pool_start() { POOL_LIMIT=$1; POOL_PID=(); }
pool_reap() {       # wait until a job ends; forget the ended ones
    local p
    wait -n 2> /dev/null
    for p in "${!POOL_PID[@]}"; do
        kill -0 "$p" 2> /dev/null || unset "POOL_PID[$p]"
    done
}
pool_add() {
    while [ ${#POOL_PID[@]} -ge "$POOL_LIMIT" ]; do pool_reap; done
    "$@" &
    POOL_PID[$!]=1
}
pool_wait() { while [ ${#POOL_PID[@]} -gt 0 ]; do pool_reap; done; }

# equiv_build DIR TARGET MK ARGS...: gen_build into DIR; writes DIR.TARGET.status: "ok" or why
equiv_build() {
    local dir=$1 target=$2 mk=$3
    shift 3
    tokens_take
    if TARGET=$target GEN_MAKEFILES=$mk gen_build "$dir" "$@"; then
        echo ok > "$dir.$target.status"
    else
        echo "$WHY" > "$dir.$target.status"
    fi
    tokens_give
}

# equiv_row I: row I's run (unless a shared reference run was made already) and its
# comparisons; writes $S/run/TAG.result: "pass", "fail<TAB>why" or "none" (a baseline),
# $S/run/TAG.ran once the run is there to be compared with, and $S/run/TAG.time: when it
# started and ended, then bash's times (this job's, its programs' CPU seconds: profiles).
equiv_row() {       # (a job of its own: times counts this row's programs)
    local t0=$EPOCHREALTIME
    equiv_row_do "$@"
    { echo "$t0 $EPOCHREALTIME"; times; } > "$S/run/${R_TAG[$1]}.time"
}
equiv_row_do() {
    local i=$1 tag=${R_TAG[$1]} name=${R_NAME[$1]} refs=${R_REFS[$1]} out
    out=$S/run/$tag.result
    if [ ! -f "$S/run/$tag.ran" ]; then
        # shellcheck disable=SC2086 # the arguments and flags are words
        local rc
        tokens_take
        RT_THREADS=${RT_THREADS:-1} run_prog "${R_PROG[$i]}" "${R_WORLD[$i]}" \
            "$S/run/$tag.log" ${R_ARGV[$i]} ${R_FLAGS[$i]} --log "$S/run/$tag.jsonl" \
            --save "$S/run/$tag.safetensors"
        rc=$?
        tokens_give
        if [ $rc != 0 ]; then
            printf 'fail\t%s\n' "training failed: $(first_error "$S/run/$tag.log")" > "$out"
            return
        fi
        if [ -z "${REFPROG[$name]}" ] && ! mem_check "$S/run/$tag.log"; then
            printf 'fail\t%s\n' "$WHY" > "$out"
            return
        fi
        touch "$S/run/$tag.ran"
    fi
    if [ "$refs" = - ]; then
        echo none > "$out"
        return
    fi
    # compare it with every reference
    local r rtag bad="" control
    SUMMARY=$S/run/$tag.summary
    for r in $refs; do
        control=0
        case $r in !*) control=1; r=${r#!} ;; esac
        rtag=${R_PREFIX}$r
        [ -n "${REFPROG[$r]}" ] && rtag=$r
        if [ ! -f "$S/run/$rtag.ran" ]; then
            bad="no run of $r to compare with"
            break
        fi
        if [ $control = 0 ]; then
            equiv_compare "$name" "$tag" "$r" "$rtag" "${R_TOL[$i]}" || { bad=$WHY; break; }
        else
            equiv_compare "$name" "$tag" "$r" "$rtag" "${R_TOL[$i]}"
            if [ "$CAUGHT" != 1 ]; then
                bad="a control went unnoticed: $WHY"
                break
            fi
        fi
    done
    if [ -n "$bad" ]; then printf 'fail\t%s\n' "$bad" > "$out"; else echo pass > "$out"; fi
}

equiv() {
    local table=$1 cuda=0 emu=0 line n=0 flags="" prefix="" vname target=train mk="" i
    local -A seen idx
    local -a ev         # what to print, in the table's order: "V<TAB>verdict<TAB>name<TAB>why"
                        # (a verdict) or "R<TAB>i" (row i's)
    [ "$2" = --cuda ] && cuda=1
    if [ "$2" = --emu ]; then
        if ! command -v g++ > /dev/null 2>&1 || [ "$(uname -m)" != x86_64 ]; then
            skip "emu-$(basename "$table" .txt)" "needs g++ (make deps) and x86-64"
            return
        fi
        emu=1
        prefix=emu.
        target=train_cuda_emu_mpi
        mk="-f Makefile -f tests/kernels/emu.mk"
    fi
    if [ $cuda = 1 ]; then
        if ! cuda_backend; then
            skip "cuda-$(basename "$table" .txt)" "the CUDA backend is not built (make echo)"
            return
        fi
        prefix=cuda.
        target=train_cuda
        have_gpu ||
            skip "cuda-run-$(basename "$table" .txt)" "no GPU (nvidia-smi lists none): built only"
    fi
    mkdir -p "$S/run" "$S/out"
    R_NAME=() R_ARGS=() R_WORLD=() R_REFS=() R_TOL=() R_FLAGS=() R_TAG=() R_VNAME=()
    R_PROG=() R_ARGV=() R_DIR=() R_PRE=() R_RUN=()
    R_PREFIX=$prefix

    # -- 1. Read the rows ----------------------------------------------------------------------
    while IFS= read -r line || [ -n "$line" ]; do
        n=$((n + 1))
        while [ "${line%\\}" != "$line" ] && IFS= read -r more; do   # continued lines
            n=$((n + 1))
            line="${line%\\} $more"
        done
        line=${line%%#*}
        [ -z "${line// /}" ] && continue
        case $line in
        @train*) flags=${line#@train}; continue ;;
        @tol*)
            local tname tspec
            read -r _ tname tspec <<< "$line"
            TOL[$tname]=$tspec
            continue ;;
        esac
        local name args world refs tol extra
        IFS='|' read -r name args world refs tol extra <<< "$line"
        read -r name <<< "$name"
        read -r world <<< "$world"
        read -r refs <<< "$refs"
        read -r tol <<< "$tol"
        read -r args <<< "$args"
        if [ -z "$name" ] || [ -z "$args" ] || [ -z "$world" ] || [ -z "$refs" ]; then
            ev+=("V	fail	table	$table:$n: want 'name | gen args | world | reference | tolerances'")
            continue
        fi
        if [ -n "${seen[$name]}" ]; then
            ev+=("V	fail	table	$table:$n: '$name' appears twice")
            continue
        fi
        if [ "$refs" != - ] && [ -z "${TOL[$tol]}" ]; then
            ev+=("V	fail	table	$table:$n: no '@tol $tol' line before this row")
            continue
        fi
        seen[$name]=1
        WORLD[$name]=$world
        args=${args//\$S/$S}
        args=${args//\$NAME/$name}
        local f="$flags $extra" tag=$prefix$name
        f=${f//\$S/$S}
        f=${f//\$NAME/$tag}
        vname=$name
        [ $cuda = 1 ] && vname=cuda-run-$name
        [ $emu = 1 ] && vname=emu-run-$name
        case $args in
        gpt2_ref\ *)
            tag=$name
            REFPROG[$name]=1
            R_PROG[$n]=build/ref/gpt2_ref
            R_ARGV[$n]=${args#gpt2_ref } ;;
        *)
            if [ "$world" != 1 ] && ! have_mpi; then
                ev+=("V	skip	$vname	mpirun not found (make deps)")
                continue
            fi
            # built once per distinct gen args (in this suite)
            [ -z "${BUILT[$args]}" ] && BUILT[$args]=$S/out/$name
            R_DIR[$n]=${BUILT[$args]}
            R_ARGV[$n]=--quiet ;;
        esac
        R_NAME[$n]=$name R_ARGS[$n]=$args R_WORLD[$n]=$world R_REFS[$n]=$refs
        R_TOL[$n]=${TOL[$tol]} R_FLAGS[$n]=$f R_TAG[$n]=$tag R_VNAME[$n]=$vname
        idx[$tag]=$n
        ev+=("R	$n")
    done < "$table"

    # -- 2. Build each distinct program ---------------------------------------------------------
    local -A building
    pool_start "${TEST_BUILD_JOBS:-2}"
    for i in "${!R_DIR[@]}"; do
        local key="${R_DIR[$i]} $target"
        [ -n "${building[$key]}" ] && continue
        building[$key]=1
        # shellcheck disable=SC2086 # the arguments are words
        pool_add equiv_build "${R_DIR[$i]}" $target "$mk" ${R_ARGS[$i]}
    done
    pool_wait
    local bprefix=""            # the build's verdict
    [ $cuda = 1 ] && bprefix=cuda-build-
    [ $emu = 1 ] && bprefix=emu-build-
    for i in "${!R_DIR[@]}"; do
        local dir=${R_DIR[$i]} st name=${R_NAME[$i]} w
        st=$(cat "$dir.$target.status" 2> /dev/null)
        if [ "$st" != ok ]; then
            R_PRE[$i]="fail	$bprefix$name	$st"
            continue
        fi
        DIR[$name]=$dir
        w=$(world_of "$dir")
        if [ "$w" != "${R_WORLD[$i]}" ]; then
            R_PRE[$i]="fail	table	$table:$i: '$name' has world $w, not ${R_WORLD[$i]}"
            continue
        fi
        R_PROG[$i]=$dir/$target
        if [ $cuda = 1 ]; then
            R_PRE[$i]="pass	cuda-build-$name"
            have_gpu || continue
        fi
        R_RUN[$i]=1
    done
    for i in "${!R_NAME[@]}"; do
        [ -z "${R_DIR[$i]}" ] && R_RUN[$i]=1       # the reference program's rows
    done

    # -- 3. Run and compare, each row once what it needs has run ------------------------------
    local -A dep started
    local -a todo
    for i in "${!R_RUN[@]}"; do
        local d="" r w
        for r in ${R_REFS[$i]}; do
            r=${r#!}
            w=${idx[$prefix$r]:-${idx[$r]}}
            [ -n "$w" ] && [ -n "${R_RUN[$w]}" ] && [ "$w" != "$i" ] && d="$d $w"
        done
        for w in ${R_FLAGS[$i]}; do
            [ "${w#"$S/run/"}" != "$w" ] || continue
            w=${w#"$S/run/"}
            w=${idx[${w%.*}]}
            [ -n "$w" ] && [ -n "${R_RUN[$w]}" ] && [ "$w" != "$i" ] && d="$d $w"
        done
        dep[$i]=$d
        todo+=("$i")
    done
    pool_start "${TEST_ROW_JOBS:-2}"
    for i in "${todo[@]}"; do rm -f "$S/run/${R_TAG[$i]}.result"; done
    while [ ${#todo[@]} -gt 0 ]; do
        local rest=() ready=""
        for i in "${todo[@]}"; do
            local ok=1 w
            for w in ${dep[$i]}; do     # done: its result is written
                if [ -z "${started[$w]}" ] || [ ! -f "$S/run/${R_TAG[$w]}.result" ]; then
                    ok=0
                    break
                fi
            done
            if [ $ok = 1 ] && [ -z "$ready" ]; then ready=$i; else rest+=("$i"); fi
        done
        if [ -z "$ready" ] && [ ${#POOL_PID[@]} -gt 0 ]; then
            pool_reap
            continue
        fi
        if [ -z "$ready" ]; then        # waits for no row that runs: cannot happen; go on
            ready=${todo[0]}
            rest=("${todo[@]:1}")
        fi
        pool_add equiv_row "$ready"
        started[$ready]=1
        todo=("${rest[@]}")
    done
    pool_wait

    # -- 4. The verdicts, in the table's order --------------------------------------------------
    local e kind a b c res why
    for e in "${ev[@]}"; do
        IFS='	' read -r kind a b c <<< "$e"
        if [ "$kind" = V ]; then
            "$a" "$b" "$c"
            continue
        fi
        i=$a
        if [ -n "${R_PRE[$i]}" ]; then
            IFS='	' read -r a b c <<< "${R_PRE[$i]}"
            "$a" "$b" "$c"
        fi
        [ -n "${R_RUN[$i]}" ] || continue
        a=$S/run/${R_TAG[$i]}
        [ -f "$a.ran" ] && RAN[${R_TAG[$i]}]=1
        [ -f "$a.summary" ] && cat "$a.summary" >> "$S/summary.txt"
        res="" why=""
        [ -f "$a.result" ] && IFS='	' read -r res why < "$a.result"
        case $res in
        pass) pass "${R_VNAME[$i]}" ;;
        fail) fail "${R_VNAME[$i]}" "$why" ;;
        none) ;;
        *) fail "${R_VNAME[$i]}" "the row's run ended without a result ($a.result)" ;;
        esac
    done
}
