#!/bin/bash
# tests/runtime/suite.sh: the runtime's tests (docs/DESIGN.md §3). Builds the test programs
# (make runtime-tests), runs every primitive on the CPU backend with 1, 2, 3, 4 and 8 ranks,
# the asynchronous calls against the blocking ones, compute and randomness checks, groups from
# hand-written and generated tables, fault injection (each bounded by `timeout`, message
# checked), the trace, the CUDA backend's communication on the CPU emulation of CUDA, and the
# CUDA build (+ GPU runs when nvidia-smi lists a device). Prints PASS/FAIL/SKIP runtime/<name>;
# scratch in build/test/runtime.
. "$(dirname "$0")/../lib.sh" runtime
B=build/runtime/test

# first line that looks like an error in a log, for FAIL messages
why() { grep -m1 -E '^\[rank|error|FAIL|Error' "$1" | cut -c1-200; }

# run NAME NP CMD... : PASS when the program exits 0 and printed its "ok" line
run() {
    local name=$1 np=$2 log="$S/$1.log"
    shift 2
    if [ "$np" = 0 ]; then          # no mpirun: a single-rank program on its own
        timeout 120 "$@" > "$log" 2>&1 < /dev/null
    else
        timeout 120 $MPIRUN -np "$np" "$@" > "$log" 2>&1 < /dev/null
    fi
    local rc=$?
    if [ $rc -eq 0 ] && grep -q '^ok ' "$log"; then
        pass "$name"
    else
        fail "$name" "exit $rc; $(why "$log")"
    fi
}

# fault NAME LIMIT PATTERN CMD... : the command must fail (exit != 0) within LIMIT seconds
# and its output must contain PATTERN (grep -E)
fault() {
    local name=$1 limit=$2 pat=$3 log="$S/$1.log"
    shift 3
    local t0 rc dt
    t0=$(date +%s%N)
    timeout 60 "$@" > "$log" 2>&1 < /dev/null
    rc=$?
    dt=$(( ($(date +%s%N) - t0) / 1000000000 ))
    if [ $rc -eq 0 ]; then
        fail "$name" "exited 0, expected a failure"
    elif [ $rc -eq 124 ]; then
        fail "$name" "still running after 60 s (hang)"
    elif [ "$dt" -ge "$limit" ]; then
        fail "$name" "took $dt s (limit $limit s)"
    elif ! grep -qE -- "$pat" "$log"; then
        fail "$name" "message not found: $pat; got: $(head -c 200 "$log" | tr '\n' ' ')"
    else
        pass "$name"
    fi
}

# -- Build ------------------------------------------------------------------------------------
if make -s runtime-tests runtime-tests-single > "$S/build.log" 2>&1; then
    pass build-cpu
else
    fail build-cpu "make runtime-tests: $(grep -m1 -E 'error|Error' "$S/build.log")"
    finish
fi

# -- Layering: each object calls only what the layers below it define --------------------------
# rt_common.o (threads, watchdog, trace, messages) <- rt_mpi.o (MPI: groups, host collectives,
# abort) <- rt_cpu.o | rt_cuda.o (the backends). An upward call (rt_common reaching into MPI or
# a backend, rt_mpi into a backend) is the cycle this layout removed; the symbol tables say.
defined() { nm "$@" 2> /dev/null | awk '$2 ~ /^[TDBR]$/ { print $3 }' | sort -u; }
undefined() { nm -u "$1" 2> /dev/null | awk '{ print $2 }' | sort -u; }
layer_ok=1
O=build/runtime
below=""
for obj in rt_common rt_mpi rt_cpu rt_cuda; do
    [ -f "$O/$obj.o" ] || continue
    # shellcheck disable=SC2086 # below is a list of files
    own=$(defined "$O/$obj.o" $below)
    up=$(undefined "$O/$obj.o" | grep -E '^rt_' | grep -vxF "$own")
    case $obj in
    rt_common) ext=$(undefined "$O/$obj.o" |
                     grep -E '^(MPI_|ompi_|cuda|cublas|nccl|cblas_|openblas_|dnnl_|omp_)') ;;
    rt_mpi) ext=$(undefined "$O/$obj.o" | grep -E '^(cuda|cublas|nccl|cblas_|openblas_|dnnl_|omp_)') ;;
    *) ext="" ;;
    esac
    if [ -n "$up$ext" ]; then
        layer_ok=0
        echo "  $obj.o calls upward: $(echo $up $ext | cut -c1-160)"
    fi
    [ "$obj" = rt_cpu ] || below="$below $O/$obj.o"
done
if [ ! -f "$O/rt_common.o" ] || [ ! -f "$O/rt_mpi.o" ]; then
    fail layering "build/runtime/rt_common.o or rt_mpi.o is missing"
elif [ $layer_ok = 1 ]; then
    pass layering
else
    fail layering "a runtime layer calls a layer above it (symbols listed above)"
fi

# -- Communication: every primitive, group kind and dtype, 1-8 ranks ---------------------------
SIZES="0 1 2 3 7 31 257 4099"
for np in 1 2 3 4 8; do
    run "coll-np$np" "$np" $B/t_coll_cpu $SIZES
done
# Large enough that the in-place reduce-scatter goes in slices (above 8 MiB in all: every dtype
# at 4 ranks, f32 and wider at 8 with the smaller size, which keeps 8 oversubscribed ranks quick)
for np in 1 2 3 4; do
    run "coll-large-np$np" "$np" $B/t_coll_cpu --large 1048579
done
run coll-large-np8 8 $B/t_coll_cpu --large 300007
# bf16 sums travel as bf16 in slices of 8 MiB (rt_mpi.c): above 4 Mi elements the allreduce
# and the reduce-scatter take several, at a member count that does not divide the slice (bf16
# alone: the other dtypes' slices are the runs above)
run coll-large-np3-bf16-slices 3 $B/t_coll_cpu --large 4194311 --dtype bf16
run coll-single-no-mpirun 0 $B/t_coll_cpu 0 1 5 1000

# -- Asynchronous calls: against the blocking ones bit for bit (and the group-rank order of
# reductions), several requests in flight, p2p requests, rt_progress alone completing one ----
for np in 1 2 3 4 8; do
    run "async-np$np" "$np" $B/t_async_cpu
done
# several slices of 1 MiB messages in flight (the reduction's pipeline), uneven last slices
# (at 4 ranks the last slice has 3 elements: members with empty blocks)
for np in 2 3 4; do
    run "async-large-np$np" "$np" $B/t_async_cpu --large 1048579
done
run async-single-no-mpirun 0 $B/t_async_cpu
# the single-rank library (no MPI): every request complete at its start
run async-single-library 0 $B/single/t_async

# -- Compute and memory (one rank, no mpirun): pool of 2 and of 1 ------------------------------
RT_THREADS=2 run compute-2threads 0 $B/t_gemm_cpu
# (the GPT-2 shapes once: a pool of 1 takes no other path through them)
RT_THREADS=1 run compute-1thread 0 $B/t_gemm_cpu --no-gpt2

# -- Randomness -----------------------------------------------------------------------------
run rng-np1 0 $B/t_rng_cpu
run rng-np3 3 $B/t_rng_cpu
if ! command -v lua5.4 > /dev/null; then
    skip rng-lua "lua5.4 not installed"
elif ! lua5.4 tests/runtime/philox_ref.lua kat > "$S/rng-lua.log" 2>&1; then
    fail rng-lua "the Lua reference fails the Random123 known answers: $(head -1 "$S/rng-lua.log")"
else
    ok=1
    for args in "1234 0xfe480316132b4b7c 0 1000" "42 7 4294967290 64" \
                "0xdeadbeef00c0ffee 0x8000000000000001 123456789 256"; do
        # shellcheck disable=SC2086
        $B/t_rng_cpu dump $args > "$S/rng-c.txt" 2>> "$S/rng-lua.log" &&
            lua5.4 tests/runtime/philox_ref.lua normal $args > "$S/rng-lua.txt" 2>> "$S/rng-lua.log"
        if ! cmp -s "$S/rng-c.txt" "$S/rng-lua.txt"; then
            ok=0
            first=$(diff "$S/rng-c.txt" "$S/rng-lua.txt" | sed -n 2p)
            fail rng-lua "rt_rng_normal differs from philox_ref.lua for ($args): $first"
            break
        fi
    done
    [ $ok = 1 ] && pass rng-lua
fi

# -- Groups from hand-written tables ------------------------------------------------------------
for np in 1 2 3 4 8; do
    run "groups-hand-np$np" "$np" $B/t_groups_cpu
done

# -- Groups from the generator's topology.json -----------------------------------------------
if [ ! -x build/gen ]; then
    skip groups-gen "build/gen not built (the generator is needed for topology.json)"
else
    while read -r cfg; do
        [ -z "$cfg" ] && continue
        name="groups-gen-$(echo "$cfg" | tr -s ' -' '_' | sed 's/^_//; s/__/_/g')"
        dir="$S/gen_$(echo "$cfg" | tr -cs 'a-z0-9' '_')"
        rm -rf "$dir"
        # only the build-time picture: every layout has one, also those (CP) the training
        # programs do not support yet
        # shellcheck disable=SC2086
        if ! build/gen $cfg --topology-only --out "$dir" > "$S/$name.gen.log" 2>&1; then
            fail "$name" "build/gen $cfg --topology-only: $(grep -m1 error "$S/$name.gen.log")"
            continue
        fi
        if ! build/gen --lua tests/runtime/topo2c.lua "$dir/topology.json" "$dir/tables.c" \
                "$cfg" > "$S/$name.lua.log" 2>&1; then
            fail "$name" "topo2c.lua: $(head -1 "$S/$name.lua.log")"
            continue
        fi
        if ! make -s GROUPS_DIR="$dir" "$dir/t_groups" > "$S/$name.make.log" 2>&1; then
            fail "$name" "build: $(grep -m1 error "$S/$name.make.log")"
            continue
        fi
        world=$(grep -o '"world": *[0-9]*' "$dir/topology.json" | grep -o '[0-9]*$')
        run "$name" "$world" "$dir/t_groups"
    done <<'EOF'
tiny --tp 2 --pp 2 --dp 2
tiny --tp 2 --pp 2 --dp 2 --order pp-dp-tp
tiny --pp 4 --dp 2
tiny --tp 4 --dp 2
tiny --tp 2 --cp 2 --dp 2
tiny_moe --tp 2 --ep 2 --dp 2 --sp
tiny_moe --ep 4 --dp 4 --pp 2
tiny --tp 2 --pp 2
tiny
EOF
fi

# -- Faults: each ends with a clear message in bounded time ----------------------------------
F=$B/t_fault_cpu
fault fault-wrongnp 30 '^\[rank 0/8\] built for 64 ranks \(tp8 pp8 dp1\), launched with 8$' \
    $MPIRUN -np 8 $F wrongnp
n=$(grep -c 'built for' "$S/fault-wrongnp.log")
[ "$n" = 1 ] || fail fault-wrongnp-once "the wrong-size message was printed $n times, want once"
[ "$n" = 1 ] && pass fault-wrongnp-once
fault fault-wrongnp-no-mpirun 30 \
    '^\[rank 0/1\] built for 64 ranks \(tp8 pp8 dp1\), launched with 1$' $F wrongnp
fault fault-check 30 '^\[rank 1/2\] tests/runtime/t_fault\.c:[0-9]+: custom failure 42$' \
    $MPIRUN -np 2 $F check
pat='^\[rank 0/2\] tests/runtime/t_fault\.c:[0-9]+: '
fault fault-mpi-error 30 "${pat}MPI error: MPI_ERR_RANK: invalid rank \\(MPI_Send\\)$" \
    $MPIRUN -np 2 $F mpierr
fault fault-exit-early 30 '^\[rank 1/2\] exited without rt_finalize' $MPIRUN -np 2 $F exit
fault fault-return-without-finalize 30 '^\[rank 2/3\] exited without rt_finalize' \
    $MPIRUN -np 3 $F nofinalize
fault fault-raise-sigkill 30 'exited on signal 9|watchdog' $MPIRUN -np 2 $F raise
# a rank killed from outside (kill -9) while the other waits in an allreduce
log="$S/fault-kill-9.log"
rm -f "$S/hang.pid"
t0=$(date +%s)
RT_TIMEOUT=20 timeout 60 $MPIRUN -np 2 $F hang "$S/hang.pid" > "$log" 2>&1 < /dev/null &
job=$!
for _ in $(seq 100); do [ -s "$S/hang.pid" ] && break; sleep 0.1; done
if [ ! -s "$S/hang.pid" ]; then
    fail fault-kill-9 "rank 1 never wrote its pid"
    kill "$job" 2> /dev/null
else
    sleep 0.5
    kill -9 "$(cat "$S/hang.pid")"
    wait "$job"
    rc=$?
    dt=$(( $(date +%s) - t0 ))
    if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $dt -gt 30 ]; then
        fail fault-kill-9 "exit $rc after $dt s"
    elif ! grep -qE 'exited on signal 9|watchdog' "$log"; then
        fail fault-kill-9 "no message naming the dead rank: $(head -c 200 "$log" | tr '\n' ' ')"
    else
        pass fault-kill-9
    fi
fi
# the same deaths with a launcher that does not abort the job: our watchdog ends it
NOABORT="--mca orte_abort_on_non_zero_status 0"
WD='did not complete within 3 s \(waiting for rank 1\)$'
RT_TIMEOUT=3 fault fault-dead-rank-watchdog 20 \
    "^\\[rank 0/2\\] watchdog: allreduce on group world \\(ranks 0,1\\) $WD" \
    $MPIRUN $NOABORT -np 2 $F _exit
RT_TIMEOUT=3 fault fault-recv-without-send 20 \
    '^\[rank 0/2\] watchdog: p2p \(recv 10 f32 from rank 1 tag 0\) did not complete within 3 s$' \
    $MPIRUN -np 2 $F norecv
RT_TIMEOUT=3 fault fault-recv-without-send-started 20 \
    '^\[rank 0/2\] watchdog: p2p \(recv 10 f32 from rank 1 tag 0\) did not complete within 3 s$' \
    $MPIRUN -np 2 $F norecv2
fault fault-request-not-waited 30 \
    '^\[rank 0/2\] rt_finalize with 1 request not waited \(the oldest: request 1, allreduce on '\
'group dp \(ranks 0,1\); every rt_\*_start needs its rt_wait\)$' $MPIRUN -np 2 $F nowait
RT_TIMEOUT=3 fault fault-stuck-allreduce 20 \
    "^\\[rank 0/2\\] watchdog: allreduce on group tp \\(ranks 0,1\\) $WD" $MPIRUN -np 2 $F stuck
RT_TIMEOUT=3 fault fault-stuck-async-allreduce 20 \
    "^\\[rank 0/2\\] watchdog: allreduce on group tp \\(ranks 0,1\\) $WD" \
    $MPIRUN -np 2 $F asyncstuck
fault fault-group-not-member 30 "group embd: rank 1 passed a group it is not in" \
    $MPIRUN -np 2 $F notmember
fault fault-null-group 30 '^\[rank 1/2\] allreduce on a NULL group' $MPIRUN -np 2 $F nullgroup
fault fault-group-mismatch 30 "group tp: ranks disagree on the members" $MPIRUN -np 2 $F badtable
RT_TIMEOUT=abc fault fault-bad-timeout 30 "RT_TIMEOUT='abc': expected seconds" $F ok
# -- Trace (RT_TRACE): every call kind, each rank's file exactly -----------------------------
# trace_check PROG TAG [LAUNCHER...]: two ranks; the lines of t_trace.c exactly, then with
# RT_TRACE_TIMES=1 the same lines, each blocking call's and wait's ending in " t=<seconds>"
trace_check() {
    local prog=$1 tag=$2 d=$S/trace-$2 r p t
    for t in 0 1; do
        rm -rf "$d" && mkdir -p "$d"
        if ! RT_TRACE=$d RT_TRACE_TIMES=$t timeout 60 $MPIRUN -np 2 "$prog" > "$d.log" 2>&1 \
                < /dev/null; then
            fail "trace-$tag" "t_trace failed: $(head -n 1 "$d.log")"
            return
        fi
        for r in 0 1; do
            p=$((1 - r))
            printf '%s\n' "allreduce tp 3 f32 sum" "allreduce world 2 i32 max" \
                "allgather tp 4 f32" "reduce_scatter tp 5 f32" "alltoallv tp f32" \
                "barrier world" "p2p send $p 6 f32 0 recv $p 6 f32 0" \
                "allreduce tp 7 f32 sum start 1" "p2p send $p 6 f32 0 recv $p 6 f32 0 start 2" \
                "reduce_scatter tp 4 bf16 start 3" "allgather tp 2 i32 start 4" "wait 2 p2p" \
                "wait 1 allreduce tp" "allreduce tp 0 f32 max" "wait 4 allgather tp" \
                "wait 3 reduce_scatter tp" > "$d/want_$r"
            if [ $t = 1 ]; then     # timed: every line but the starts', and only those
                if grep -vE ' start [0-9]+$' "$d/rank_0000$r.trace" |
                       grep -qvE ' t=[0-9]+\.[0-9]{6}$' ||
                   grep -qE ' start [0-9]+ t=' "$d/rank_0000$r.trace"; then
                    fail "trace-$tag" "RT_TRACE_TIMES=1: rank $r's lines lack (or starts" \
                        "carry) ' t=<seconds>': $(head -n 2 "$d/rank_0000$r.trace" | tr '\n' '|')"
                    return
                fi
                sed -i -E 's/ t=[0-9]+\.[0-9]{6}$//' "$d/rank_0000$r.trace"
            fi
            if ! diff "$d/want_$r" "$d/rank_0000$r.trace" > "$d/diff_$r" 2>&1; then
                fail "trace-$tag" "rank $r's trace differs (RT_TRACE_TIMES=$t):" \
                    "$(grep -m1 '^[<>]' "$d/diff_$r")"
                return
            fi
        done
    done
    pass "trace-$tag"
}
trace_check "$B/t_trace_cpu" cpu

# the control: the same program without a fault exits 0 and prints nothing
timeout 60 $MPIRUN -np 2 $F ok > "$S/fault-control.log" 2>&1 < /dev/null
rc=$?
if [ $rc -ne 0 ] || grep -q . "$S/fault-control.log"; then
    fail fault-control "a clean run exited $rc and printed: $(head -1 "$S/fault-control.log")"
else
    pass fault-control
fi

# -- The CUDA backend on the CPU emulation of CUDA (tests/kernels/emu) -------------------------
# runtime/rt_cuda.cu compiled against the emulated runtime API: its request code (events,
# communication streams, pinned staging) single-rank and, with MPI, on the MPI transport (the
# ranks share the one emulated device)
if ! command -v g++ > /dev/null 2>&1 || [ "$(uname -m)" != x86_64 ]; then
    skip cuda-emu "needs g++ and x86-64 (the emulation's fibers)"
elif ! make -s build/emu/t_async_cuda build/emu/t_async_cuda_mpi build/emu/t_coll_cuda_mpi \
        build/emu/t_trace_cuda_mpi > "$S/build-emu.log" 2>&1; then
    fail build-cuda-emu "$(grep -m1 -E 'error|Error' "$S/build-emu.log")"
else
    pass build-cuda-emu
    run emu-async-single 0 build/emu/t_async_cuda
    for np in 1 2 3; do
        run "emu-async-mpi-np$np" "$np" build/emu/t_async_cuda_mpi
    done
    run emu-async-mpi-large-np2 2 build/emu/t_async_cuda_mpi --large 1048579
    run emu-coll-mpi-np3 3 build/emu/t_coll_cuda_mpi $SIZES
    trace_check build/emu/t_trace_cuda_mpi emu-cuda-mpi
fi

# -- CUDA backend ---------------------------------------------------------------------------
if make -s runtime-tests-cuda > "$S/build-cuda.log" 2>&1; then
    pass build-cuda
    if command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then
        ngpu=$(nvidia-smi -L | grep -c '^GPU')
        run cuda-coll-np1 0 $B/t_coll_cuda $SIZES
        run cuda-async-np1 0 $B/t_async_cuda
        run cuda-compute 0 $B/t_gemm_cuda
        run cuda-rng 0 $B/t_rng_cuda
        RT_TRANSPORT=mpi run cuda-coll-mpi-np2 2 $B/t_coll_cuda $SIZES
        RT_TRANSPORT=mpi run cuda-async-mpi-np2 2 $B/t_async_cuda
        RT_TRANSPORT=mpi run cuda-groups-mpi-np4 4 $B/t_groups_cuda
        RT_TRANSPORT=mpi run cuda-rng-mpi-np2 2 $B/t_rng_cuda
        if [ "$ngpu" -ge 2 ]; then
            run cuda-coll-nccl-np2 2 $B/t_coll_cuda $SIZES
            run cuda-coll-nccl-large-np2 2 $B/t_coll_cuda --large 1048579
            run cuda-async-nccl-np2 2 $B/t_async_cuda
            run cuda-async-nccl-large-np2 2 $B/t_async_cuda --large 1048579
            trace_check "$B/t_trace_cuda" cuda-nccl
            [ "$ngpu" -ge 4 ] && run cuda-groups-nccl-np4 4 $B/t_groups_cuda
            RT_TIMEOUT=5 fault cuda-fault-stuck-nccl 40 \
                'watchdog: allreduce on group tp \(ranks 0,1\) did not complete within 5 s' \
                $MPIRUN -np 2 $B/t_fault_cuda stuck
            RT_TIMEOUT=5 fault cuda-fault-stuck-async-nccl 40 \
                'watchdog: allreduce on group tp \(ranks 0,1\) did not complete within 5 s' \
                $MPIRUN -np 2 $B/t_fault_cuda asyncstuck
        else
            skip cuda-nccl "NCCL runs need 2 GPUs, nvidia-smi lists $ngpu"
        fi
    else
        skip cuda-run "no GPU (nvidia-smi lists none): the CUDA backend was built and linked only"
    fi
elif grep -q 'CUDA backend not built' "$S/build-cuda.log"; then
    skip build-cuda "$(head -1 "$S/build-cuda.log")"
else
    fail build-cuda "make runtime-tests-cuda: $(grep -m1 -E 'error|Error' "$S/build-cuda.log")"
fi

finish
