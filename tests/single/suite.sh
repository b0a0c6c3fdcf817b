#!/bin/bash
# tests/single/suite.sh: the single-rank programs without MPI (train_single, train_cuda_single:
# the generated sources over build/librt_*_single.a, runtime/rt_single.c). For layouts of one
# rank the Makefile builds them beside train; their runs must be bit-identical to train's (same
# flags, same data, same RT_TRACE), ldd must list no MPI library, a bigger layout and a launch
# on several ranks are refused with one message, and the runtime's own tests pass over the
# single-rank library (p2p refused). CUDA: built and checked with ldd here; on a machine with
# a GPU, run and compared with train_single. Prints PASS/FAIL/SKIP single/<name> (tests/lib.sh).
#
# Tolerances: train_single vs train exact (the same code over the same one-member collectives:
# every collective of a world of one is a no-op or a copy in both runtimes). train_cuda_single
# vs train_single on a GPU: tests/train's CUDA tolerances (losses 1e-5 relative, lr 1e-6,
# grad_norm 1e-5; weights |a - b| <= 1e-5 + 1e-5|b|), f32 layouts only. train_emu and
# train_cuda_emu, the CUDA kernels and runtime on the CPU emulation of CUDA: below.
. "$(dirname "$0")/../lib.sh" single

SAME_MSG='this single-rank program \(no MPI\) runs layouts of one rank only; use train / '
SAME_MSG="${SAME_MSG}train_cuda under mpirun"

# -- Setup --------------------------------------------------------------------------------------
if ! make -s --no-print-directory build/gen build/librt_cpu.a build/librt_cpu_single.a \
        build/libgpt_cpu.a build/ref/make_tokens build/tools/stcompare runtime-tests-single \
        > "$S/make.log" 2>&1; then
    fail setup "make (gen, libraries, make_tokens, runtime-tests-single):" \
        "$(first_error "$S/make.log")"
    finish
fi
V=$(build/gen tiny --dump config 2> /dev/null | sed -n 's/^    "vocab": \([0-9]*\),*$/\1/p' |
    head -n 1)
if [ -z "$V" ] || ! build/ref/make_tokens --vocab "$V" --tokens 20000 "$S/tok.bin" \
        > "$S/tok.log" 2>&1; then
    fail setup "cannot make the token file (vocab '$V'): $(head -n 1 "$S/tok.log")"
    finish
fi
CUDA=0
cuda_backend && CUDA=1

# no_mpi_lib PROG: ldd lists no MPI library (WHY says which it lists)
no_mpi_lib() {
    local libs
    libs=$(ldd "$1" 2>&1 | grep -iE 'libmpi|open-?rte|open-?pal|libpmix|libmpich')
    WHY="ldd $1 lists: $(echo "$libs" | awk '{ print $1 }' | tr '\n' ' ')"
    [ -z "$libs" ]
}

# -- Layouts of one rank: the Makefile's flow builds all four; runs match train bit for bit ----
F="--data $S/tok.bin --steps 6 --lr 1e-3 --warmup 2 --quiet"
declare -A SINGLE_DIR
while IFS='|' read -r name args; do
    read -r name <<< "$name"
    [ -z "$name" ] && continue
    d=$S/$name
    # shellcheck disable=SC2086 # the arguments are words
    if ! build/gen $args --out "$d" > "$d.gen.log" 2>&1; then
        fail "$name-build" "build/gen $args: $(first_error "$d.gen.log")"
        continue
    fi
    if ! make -s --no-print-directory -j2 GEN_DIR="$d" GEN_OBJ="$d.obj" build-gen-dir \
            > "$d.build.log" 2>&1 < /dev/null; then
        fail "$name-build" "make build-gen-dir: $(first_error "$d.build.log")"
        continue
    fi
    missing=""
    for p in train train_single $([ $CUDA = 1 ] && echo train_cuda train_cuda_single); do
        [ -x "$d/$p" ] || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        fail "$name-build" "make build-gen-dir (world 1) did not build:$missing"
        continue
    fi
    pass "$name-build"
    SINGLE_DIR[$name]=$d
    ok=1
    for p in train train_single; do
        mkdir -p "$S/trace.$name.$p"
        # shellcheck disable=SC2086 # the flags are words
        if ! RT_TRACE="$S/trace.$name.$p" run_prog "$d/$p" 1 "$S/$name.$p.log" $F \
                --log "$S/$name.$p.jsonl" --save "$S/$name.$p.safetensors"; then
            fail "$name-same" "$p failed: $(first_error "$S/$name.$p.log")"
            ok=0
            break
        fi
    done
    [ $ok = 1 ] || continue
    if ! diff <(sed 's/,"ms":.*//' "$S/$name.train.jsonl") \
              <(sed 's/,"ms":.*//' "$S/$name.train_single.jsonl") > "$S/$name.diff" 2>&1; then
        fail "$name-same" "the logs differ: $(grep -m1 '^[<>]' "$S/$name.diff")"
    elif ! cmp "$S/$name.train.safetensors" "$S/$name.train_single.safetensors" \
            > "$S/$name.diff" 2>&1; then
        fail "$name-same" "the saved weights differ: $(head -n 1 "$S/$name.diff")"
    elif ! diff -r "$S/trace.$name.train" "$S/trace.$name.train_single" > "$S/$name.diff" 2>&1
    then
        fail "$name-same" "the RT_TRACE files differ: $(grep -m1 '^[<>]' "$S/$name.diff")"
    elif [ "$(wc -l < "$S/$name.train_single.jsonl")" != 6 ]; then
        fail "$name-same" "train_single logged $(wc -l < "$S/$name.train_single.jsonl") steps"
    else
        pass "$name-same"
    fi
done <<'EOF'
tiny          | tiny
tiny_bf16     | tiny --bf16 --mbs 2 --nmb 2
tiny_llama    | tiny_llama
tiny_moe      | tiny_moe --dist-opt
EOF

# -- No MPI library: ldd of the single programs (and, as the control, train lists one) ---------
d=${SINGLE_DIR[tiny]}
if [ -z "$d" ]; then
    fail ldd "tiny was not built"
elif ! ldd "$d/train" 2>&1 | grep -qi 'libmpi'; then
    fail ldd "the control failed: ldd of train lists no libmpi, so the check cannot see one"
elif ! no_mpi_lib "$d/train_single"; then
    fail ldd "$WHY"
elif nm -u "$d/train_single" 2> /dev/null | grep -q ' MPI_'; then
    fail ldd "train_single has undefined MPI_ symbols: $(nm -u "$d/train_single" | grep -m1 MPI_)"
else
    pass ldd
fi
# ... and no MPI symbol in the single-rank runtime libraries' objects
libs=(build/librt_cpu_single.a)
[ $CUDA = 1 ] && libs+=(build/librt_cuda_single.a)
syms=$(nm -u "${libs[@]}" 2> /dev/null |
       awk '$2 ~ /^(MPI_|PMPI_|ompi_|opal_)/ { print $2 }' | sort -u | tr '\n' ' ')
if [ -n "$syms" ]; then
    fail no-mpi-symbols "build/librt_*_single.a call: $(echo "$syms" | cut -c1-160)"
else
    pass no-mpi-symbols
fi
if [ $CUDA = 0 ]; then
    skip ldd-cuda "the CUDA backend is not built (make echo)"
elif [ -z "$d" ]; then
    fail ldd-cuda "tiny was not built"
elif ! no_mpi_lib "$d/train_cuda_single"; then
    fail ldd-cuda "$WHY"
else
    pass ldd-cuda
fi

# -- Without MPI (no mpicc): make's plan builds the single programs with $(CC), nothing else ---
if [ -z "$d" ]; then
    fail no-mpi-make "tiny was not built"
else
    make -n -B --no-print-directory MPICC=/nonexistent/mpicc GEN_DIR="$d" GEN_OBJ="$d.obj" \
        build-gen-dir > "$S/no-mpi-make.log" 2>&1 < /dev/null
    rc=$?
    links=$(grep -oE -- "-o $d/train[a-z_]*" "$S/no-mpi-make.log" | sed 's|.*/||' | sort |
            tr '\n' ' ')
    want="train_single $([ $CUDA = 1 ] && echo "train_cuda_single ")"
    want=$(echo "$want" | tr ' ' '\n' | grep . | sort | tr '\n' ' ')
    if [ $rc != 0 ]; then
        fail no-mpi-make "make -n MPICC=/nonexistent/mpicc build-gen-dir: exit $rc"
    elif grep -qE 'nonexistent/mpicc|rt_mpi\.c' "$S/no-mpi-make.log"; then
        fail no-mpi-make "the plan still calls mpicc or compiles rt_mpi.c"
    elif [ "$links" != "$want" ]; then
        fail no-mpi-make "the plan links '$links', want '$want'"
    else
        pass no-mpi-make
    fi
fi

# -- Refusals: a layout of 8 ranks, a launch by mpirun on several ranks, p2p -------------------
W8=$S/w8
if ! build/gen tiny --tp 2 --pp 2 --dp 2 --out "$W8" > "$W8.gen.log" 2>&1; then
    fail refuse-world8 "build/gen tiny --tp 2 --pp 2 --dp 2: $(first_error "$W8.gen.log")"
else
    if make -n -s --no-print-directory GEN_DIR="$W8" GEN_OBJ="$W8.obj" build-gen-dir 2>&1 |
            grep -qF -- "-o $W8/train_single"; then
        fail world8-not-built "make build-gen-dir would build train_single for a world of 8"
    else
        pass world8-not-built
    fi
    if ! make -s --no-print-directory -j2 GEN_DIR="$W8" GEN_OBJ="$W8.obj" "$W8/train_single" \
            > "$W8.build.log" 2>&1 < /dev/null; then
        fail refuse-world8 "make $W8/train_single: $(first_error "$W8.build.log")"
    else
        timeout 60 "$W8/train_single" --data "$S/tok.bin" --steps 1 > "$W8.log" 2>&1 < /dev/null
        rc=$?
        want="^\[rank 0/1\] built for 8 ranks \(tp2 pp2 dp2\): $SAME_MSG$"
        if [ $rc != 1 ]; then
            fail refuse-world8 "exit $rc, want 1: $(head -c 200 "$W8.log")"
        elif [ "$(wc -l < "$W8.log")" != 1 ] || ! grep -qE "$want" "$W8.log"; then
            fail refuse-world8 "want the one line '$want'; got: $(head -c 300 "$W8.log")"
        else
            pass refuse-world8
        fi
    fi
fi
if [ -z "$d" ]; then
    fail refuse-mpirun "tiny was not built"
elif ! have_mpi; then
    skip refuse-mpirun "mpirun not found"
else
    # shellcheck disable=SC2086 # MPIRUN is a command with its options
    timeout 60 $MPIRUN -np 2 "$d/train_single" --data "$S/tok.bin" --steps 1 \
        > "$S/mpirun.log" 2>&1 < /dev/null
    rc=$?
    want='^\[rank 0/1\] launched on 2 ranks \(mpirun\): this single-rank program \(no MPI\)'
    if [ $rc = 0 ] || [ $rc = 124 ]; then
        fail refuse-mpirun "exit $rc under mpirun -np 2, want a refusal"
    elif ! grep -qE "$want" "$S/mpirun.log"; then
        fail refuse-mpirun "message not found: $(head -c 300 "$S/mpirun.log")"
    else
        pass refuse-mpirun
    fi
fi

# -- The runtime's tests over librt_cpu_single.a ----------------------------------------------
B=build/runtime/test/single
for t in gemm rng groups; do
    if timeout 120 "$B/t_$t" > "$S/rt-$t.log" 2>&1 < /dev/null && grep -q '^ok ' "$S/rt-$t.log"
    then
        pass "runtime-$t"
    else
        fail "runtime-$t" "$(first_error "$S/rt-$t.log")"
    fi
done
# t_coll: every collective on every group kind of a world of one passes (no check fails before
# the p2p part), then its first p2p call is refused with the one message
timeout 120 $B/t_coll 0 1 5 1000 > "$S/rt-coll.log" 2>&1 < /dev/null
rc=$?
want='^\[rank 0/1\] p2p: (send|recv) [0-9]+ [a-z0-9]+ (to|from) rank 0 tag [0-9]+: this single-rank'
want="$want program \(no MPI\) has no peers"
if [ $rc != 1 ]; then
    fail runtime-coll "exit $rc, want 1 (p2p refused): $(head -c 200 "$S/rt-coll.log")"
elif [ "$(wc -l < "$S/rt-coll.log")" != 1 ] || ! grep -qE "$want" "$S/rt-coll.log"; then
    fail runtime-coll "want only the p2p refusal; got: $(head -n 3 "$S/rt-coll.log" | tr '\n' ' ')"
else
    pass runtime-coll
fi

# -- The CUDA programs on the CPU emulation of CUDA (tests/kernels/emu, tests/kernels/emu.mk) --
# train_emu: the generated program over the library with lib/kernels_cuda.cu compiled against
# the emulation and the CPU runtime (every CUDA kernel called as training calls it).
# train_cuda_emu: also runtime/rt_cuda.cu over the emulated runtime API and cuBLAS, so the
# whole train_cuda_single path (device memory counted against the plan, cuBLAS's arguments, the
# GEMM staging) without a GPU. Both against train_single: f32 with tests/train's CUDA
# tolerances (losses and grad_norm 1e-5 relative, lr 1e-6, weights 1e-5 + 1e-5|w|); bf16 with
# tests/precision's "bf16" set (loss 2e-4, grad_norm 1e-2, weights 1e-4 + 1e-2|w| with at most
# 0.5 % out, each within 5e-3: the backends sum in other orders, so they round at other
# places). Observed: f32 loss 3.4e-7, weights 7.9e-7; bf16 loss 3.2e-5, grad_norm 1.2e-3. And
# the runtime's GEMM and RNG tests over the emulated CUDA runtime.
if ! command -v g++ > /dev/null 2>&1 || [ "$(uname -m)" != x86_64 ]; then
    skip cuda-emu "needs g++ (make deps installs it) and x86-64 (the emulation's fibers)"
else
    EMU_MK="make -s --no-print-directory -f Makefile -f tests/kernels/emu.mk"
    for name in tiny tiny_bf16 tiny_llama tiny_moe; do
        d=${SINGLE_DIR[$name]}
        [ -n "$d" ] || continue
        logtol="loss=1e-5 lr=1e-6 grad_norm=1e-5" wtol="--atol 1e-5 --rtol 1e-5"
        if [ $name = tiny_bf16 ]; then
            logtol="loss=2e-4 lr=1e-6 grad_norm=1e-2"
            wtol="--atol 1e-4 --rtol 1e-2 --outliers 5e-3 --hard 5e-3"
        fi
        for p in train_emu train_cuda_emu; do
            t=emu-kernels-$name
            [ $p = train_cuda_emu ] && t=emu-cuda-$name
            if ! $EMU_MK GEN_DIR="$d" GEN_OBJ="$d.obj" "$d/$p" > "$S/$name.$p.build.log" 2>&1 \
                    < /dev/null; then
                fail "$t" "building $p: $(first_error "$S/$name.$p.build.log")"
                continue
            fi
            # shellcheck disable=SC2086 # the flags and tolerances are words
            if ! run_prog "$d/$p" 1 "$S/$name.$p.log" $F --log "$S/$name.$p.jsonl" \
                    --save "$S/$name.$p.safetensors"; then
                fail "$t" "$p failed: $(first_error "$S/$name.$p.log")"
            elif ! out=$($LOGCMP "$S/$name.$p.jsonl" "$S/$name.train_single.jsonl" $logtol 2>&1)
            then
                fail "$t" "logs differ from train_single: $(echo "$out" | tail -n 1)"
            elif ! out=$($STCOMPARE -q $wtol "$S/$name.$p.safetensors" \
                        "$S/$name.train_single.safetensors" 2>&1); then
                fail "$t" "weights differ from train_single: $(echo "$out" | tail -n 1)"
            else
                pass "$t"
            fi
        done
    done
    for t in gemm rng; do
        if ! $EMU_MK "build/emu/t_${t}_cuda" > "$S/emu-$t.build.log" 2>&1 < /dev/null; then
            fail "emu-cuda-runtime-$t" "building: $(first_error "$S/emu-$t.build.log")"
        # shellcheck disable=SC2046 # t_gemm: every documented epilogue fused (cuBLASLt's)
        elif timeout 300 "build/emu/t_${t}_cuda" $([ $t = gemm ] && echo --fused) \
                 > "$S/emu-rt-$t.log" 2>&1 < /dev/null &&
             grep -q '^ok ' "$S/emu-rt-$t.log"; then
            pass "emu-cuda-runtime-$t"
        else
            fail "emu-cuda-runtime-$t" "$(first_error "$S/emu-rt-$t.log")"
        fi
    done
fi

# -- CUDA: on a GPU, train_cuda_single against train_single (f32 layouts) ----------------------
if [ $CUDA = 0 ]; then
    skip cuda-run "the CUDA backend is not built (make echo)"
elif ! have_gpu; then
    skip cuda-run "no GPU (nvidia-smi -L lists none): train_cuda_single built and ldd-checked"
else
    for name in tiny tiny_llama; do
        d=${SINGLE_DIR[$name]}
        [ -n "$d" ] || continue
        # shellcheck disable=SC2086 # the flags are words
        if ! run_prog "$d/train_cuda_single" 1 "$S/$name.cuda.log" $F \
                --log "$S/$name.cuda.jsonl" --save "$S/$name.cuda.safetensors"; then
            fail "cuda-run-$name" "train_cuda_single failed: $(first_error "$S/$name.cuda.log")"
        elif ! out=$($LOGCMP "$S/$name.cuda.jsonl" "$S/$name.train_single.jsonl" \
                    loss=1e-5 lr=1e-6 grad_norm=1e-5 2>&1); then
            fail "cuda-run-$name" "logs differ from train_single: $(echo "$out" | tail -n 1)"
        elif ! out=$($STCOMPARE -q --atol 1e-5 --rtol 1e-5 "$S/$name.cuda.safetensors" \
                    "$S/$name.train_single.safetensors" 2>&1); then
            fail "cuda-run-$name" "weights differ from train_single: $(echo "$out" | tail -n 1)"
        else
            pass "cuda-run-$name"
        fi
    done
fi

finish
