#!/bin/bash
# bench/gpu_batch.sh: everything the CUDA path needs a GPU for, in one batch for a lent GPU
# machine that has CUDA, nvcc and python3 but no MPI, no package manager and no network.
#
#   bench/gpu_batch.sh prepare        here (Debian, the CUDA toolkit, the project's deps): build
#                                     build/device/ (about 57 MiB; what travels, the repository
#                                     too, may not pass 64 MiB): programs, CPU references, llm.c
#   bench/gpu_batch.sh run [PART...]  on the GPU machine, from the repository root, with
#                                     build/device carried; PART: peak kernels train hf bench
#                                     profile multi big (default: all, in that order; a first
#                                     call runs the first six). Work files go to
#                                     $GPU_BATCH_WORK (default /tmp/gpu_batch); $OUT (default
#                                     build/device/out) gets summary.txt and logs.tgz.
#
# The parts (each prints PASS/FAIL lines and a table; the exit status is 1 if anything failed):
#   peak     the card's bf16 GEMM rate and copy bandwidth as found (PyTorch, CUDA events).
#   kernels  kernel_test_cuda (single-rank runtime, no MPI): every kernel in f32 and bf16
#            against the double-precision reference (tolerances: tests/kernels/kernel_test.c),
#            twice (bit-identical runs), and its f32 outputs against the CPU kernels' (1e-5
#            relative to the value and to the tensor's scale: the GPU tolerance of
#            tests/kernels/suite.sh); bf16 attention with ATTN=cudnn (cuDNN's fused attention
#            must load and accept the graphs) and ATTN=own; the runtime's t_gemm and t_rng.
#   train    train_cuda_single against train_single's log and weights, computed here, with
#            tests/single's tolerances for the CUDA kernels: tiny, tiny_llama and tiny_moe in
#            f32 (loss and grad_norm 1e-5 relative, lr 1e-6, weights 1e-5 + 1e-5|w|), tiny in
#            bf16 with tests/precision's "bf16" set (loss 2e-4, grad_norm 1e-2, weights 1e-4 +
#            1e-2|w| with at most 0.5 % out, each within 5e-3), which the emulated CUDA kernels
#            meet here (tests/single cuda-emu-train).
#   hf       transformers (on the GPU machine) loads our Hugging Face exports of tiny and
#            tiny_llama (train --save DIR, made here) from their files alone and computes the
#            program's first-step loss on the same tokens (tests/hfload/hf_transformers.py).
#   multi    layouts of several ranks sharing the GPU over the MPI transport, as
#            tests/parallel/gpu.txt and tests/moe/gpu.txt do: tiny with TP 2 x DP 2, SP and the
#            distributed optimizer (4 ranks), tiny with PP 2 (2 ranks), tiny_moe with TP 2 x
#            DP 2 x EP 2, SP and the distributed optimizer (4 ranks), each against its
#            single-rank CUDA run there with those tables' tolerances (loss, aux loss, grad_norm
#            1e-5; weights 1e-6 + 1e-5|w| with at most 0.1 % out, each within 1e-4). MPI is
#            Debian 12's Open MPI, its packages' files carried in build/device/mpi-root.tgz and
#            run from where they are unpacked (OPAL_PREFIX).
#   bench    GPT-2 124M (T = 1024, micro-batch 64), bf16, one GPU, beside llm.c (train_gpt2cu
#            built in prepare as its README builds it, for sm_90, with NO_MULTI_GPU=1,
#            NO_USE_MPI=1, USE_CUDNN=0; random init -e d12, the same token shard).
#            ms/step is the median over the steps after BENCH_WARMUP (3) of BENCH_STEPS (12);
#            tokens/s = B T / that; MFU counts 6N + 6 L C T FLOPs per token (N with the
#            unpadded vocabulary, 50257) against 989 TFLOP/s (H100 and H200 dense bf16).
#            The row "ours" takes cuDNN's fused attention where it loads (the line above the
#            table says which ran); row "own" the library's kernels (ATTN=own), and rows
#            own-fa32 and own-fa128 those with tiles of 32 and 128 rows (FA_TILE; the default
#            64), to choose the size on the card; their losses must agree with the first
#            row's at every step (1e-2 relative).
#   big      the same for GPT-2 1558M (micro-batch 8, selective recompute; llm.c -e d48).
#   profile  GPT-2 124M's step per kernel family (bench/step_profile.c with -DPROFILE_CUDA:
#            each library call timed between two cudaDeviceSynchronize), beside what
#            bench/cost_model.py predicts for each family.
# Without the prepared build/device, `run` says so and stops.
set -u
cd "$(dirname "$0")/.." || exit 1
D=build/device
MODE=${1:-}
shift 2>/dev/null

# -- prepare (here) -----------------------------------------------------------------------------
TRAIN_FLAGS="--steps 6 --lr 1e-3 --warmup 2 --quiet"
# name | gen args | ranks (the first of each model is its single-rank reference)
MULTI="m-tiny|tiny --mbs 8|1
m-tiny-tp2-dp2-sp-distopt|tiny --tp 2 --dp 2 --mbs 4 --sp --dist-opt|4
m-tiny-pp2|tiny --pp 2 --mbs 2 --nmb 4|2
m-moe|tiny_moe --mbs 2 --nmb 4|1
m-moe-ep2|tiny_moe --tp 2 --dp 2 --ep 2 --etp 2 --mbs 2 --nmb 2 --sp --dist-opt|4"
MPI_DEBS="openmpi-bin openmpi-common libopenmpi3 libpmix2 libevent-core-2.1-7
          libevent-pthreads-2.1-7 libhwloc15 libucx0 libfabric1 libibverbs1 librdmacm1 libnl-3-200
          libnl-route-3-200 libpsm2-2 libpsm-infinipath1 libnuma1 libmunge2"
BENCH_STEPS=${BENCH_STEPS:-12}
FA_TILES="32 128"         # the attention tile sizes timed beside the default (part bench)
PROFILE_WRAP="embed_fwd embed_bwd pos_fwd pos_bwd layernorm_fwd add_layernorm_fwd layernorm_bwd
      gelu_fwd gelu_bwd bias_fwd bias_bwd add_fwd add_inplace attention_fwd attention_bwd
      ce_rowmax ce_sums ce_loss ce_bwd ce_fused sum_rows adamw_step adamw_multi sumsq
      sumsq_multi scale_inplace rt_gemm rt_gemm_epi rt_memset0"

die() { echo "gpu_batch: $*" >&2; exit 1; }

# mkvar NAME: a variable of the top Makefile
mkvar() { make -s --no-print-directory -f Makefile -f <(printf 'pv:\n\t@echo $(%s)\n' "$1") pv; }

# gen_prog NAME "PROGRAMS" GENFLAGS...: generate build/device-obj/NAME.src and build its
# PROGRAMS (train_single, train_cuda_single, train_cuda, ...) there
gen_prog() {
    local name=$1 progs=$2 dir=build/device-obj/$1.src p targets=""
    shift 2
    for p in $progs; do targets="$targets $dir/$p"; done
    build/gen "$@" --out "$dir" > "$dir.gen.log" 2>&1 ||
        die "build/gen $*: $(tail -1 "$dir.gen.log")"
    # shellcheck disable=SC2086 # the targets are words
    make -s --no-print-directory -j2 GEN_DIR="$dir" GEN_OBJ="build/device-obj/$name" $targets \
        > "$dir.make.log" 2>&1 || die "building $name: $(grep -m1 -i error "$dir.make.log")"
}

prepare() {
    # The GPU machine's processor is not this one: the library is built for any x86-64 with
    # AVX2 (LIB_OPT's -march=native would not run there; the generated code's GEN_OPT names no
    # processor). Run prepare in a clean clone (objects built with -march=native here would be
    # reused as they are).
    export LIB_OPT="${LIB_OPT:--O3 -march=x86-64-v3 -fno-math-errno -fno-trapping-math}"
    make -s --no-print-directory echo 2>/dev/null | grep -q 'cuda backend enabled' ||
        die "the CUDA backend is not built here (make echo): prepare needs nvcc, cuBLAS, NCCL" \
            "and cuDNN's headers"
    local llmc=/work/.mirror/karpathy+llm.c/repo
    [ -n "${LLMC_GIT:-}" ] && llmc=$LLMC_GIT
    git -C "$llmc" rev-parse HEAD > /dev/null 2>&1 ||
        die "no llm.c git directory at $llmc (fetch github:karpathy/llm.c, or set LLMC_GIT)"
    rm -rf "$D" build/device-obj
    mkdir -p "$D/bin" "$D/ref" "$D/prog" "$D/llm.c" build/device-obj || exit 1
    local MK="make -s --no-print-directory -f Makefile -f tests/kernels/kernels.mk"
    echo "gpu_batch: building (kernels, runtime tests, programs)"
    make -s --no-print-directory build/gen build/librt_cpu.a build/librt_cpu_single.a \
        build/librt_cuda_single.a build/libgpt_cpu.a build/libgpt_cuda.a ref \
        build/ref/make_tokens build/tools/stcompare > "$D/make.log" 2>&1 ||
        die "make: $(grep -m1 -i error "$D/make.log")"
    $MK kernel-test kernel-test-cuda-single build/runtime/test/single/t_gemm_cuda \
        build/runtime/test/single/t_rng_cuda >> "$D/make.log" 2>&1 ||
        die "make kernel tests: $(grep -m1 -i error "$D/make.log")"
    cp build/test/kernels/kernel_test_cuda_single "$D/bin/kernel_test_cuda"
    cp build/runtime/test/single/t_gemm_cuda build/runtime/test/single/t_rng_cuda \
        build/tools/stcompare "$D/bin/"
    RT_THREADS=2 build/test/kernels/kernel_test_cpu kernels/cpu \
        --dump "$D/ref/kernels-cpu.safetensors" > "$D/ref/kernels-cpu.log" 2>&1 ||
        die "the CPU kernel test fails here: $(grep -m1 '^FAIL' "$D/ref/kernels-cpu.log")"
    gzip -f -9 "$D/ref/kernels-cpu.safetensors"    # 13.7 MB of f32 outputs: 12.0 packed

    # the correctness programs and their CPU references (train_single here)
    local V
    V=$(build/gen tiny --dump config 2> /dev/null | sed -n 's/^    "vocab": \([0-9]*\),*$/\1/p' |
        head -n 1)
    build/ref/make_tokens --vocab "$V" --tokens 20000 "$D/ref/tok.bin" > /dev/null ||
        die "make_tokens"
    local spec name args
    for spec in "tiny|tiny" "tiny_bf16|tiny --bf16 --mbs 2 --nmb 2" "tiny_llama|tiny_llama" \
                "tiny_moe|tiny_moe --dist-opt"; do
        name=${spec%%|*} args=${spec#*|}
        # shellcheck disable=SC2086 # the arguments are words
        gen_prog "$name" "train_single train_cuda_single" $args
        # shellcheck disable=SC2086
        build/device-obj/$name.src/train_single --data "$D/ref/tok.bin" $TRAIN_FLAGS \
            --log "$D/ref/$name.jsonl" --save "$D/ref/$name.safetensors" \
            > "$D/ref/$name.log" 2>&1 || die "train_single $name: $(tail -1 "$D/ref/$name.log")"
        cp "build/device-obj/$name.src/train_cuda_single" "$D/prog/$name"
    done

    # Hugging Face exports of tiny and tiny_llama (train --save DIR) for transformers there, each
    # with the program's first-step loss on tok.bin from the export (learning rate 0)
    mkdir -p "$D/hf"
    for name in tiny tiny_llama; do
        local p=build/device-obj/$name.src/train_single e=$D/hf/$name
        rm -rf "$e"
        "$p" --init "$D/ref/$name.safetensors" --steps 0 --save "$e" > "$e.log" 2>&1 &&
        "$p" --init "$e" --data "$D/ref/tok.bin" --steps 1 --lr 0 --log "$e.jsonl" \
            >> "$e.log" 2>&1 || die "export $name: $(tail -1 "$e.log")"
        # GBS T LOSS, for tests/hfload/hf_transformers.py
        sed -n 's/.*global batch \([0-9]*\) sequences .* of \([0-9]*\) tokens,.*/\1 \2/p' "$e.log" |
            head -n 1 | tr '\n' ' ' > "$e.args"
        sed -n 's/^{"step":1,"loss":\([^,]*\),.*/\1/p' "$e.jsonl" >> "$e.args"
        [ "$(wc -w < "$e.args")" = 3 ] || die "export $name: no batch or loss in $e.log"
    done

    # the multi-rank layouts and their single-rank references (train_cuda: MPI)
    local ranks
    while IFS='|' read -r name args ranks; do
        # shellcheck disable=SC2086 # the arguments are words
        gen_prog "$name" train_cuda $args
        cp "build/device-obj/$name.src/train_cuda" "$D/prog/$name"
    done <<< "$MULTI"
    # Debian 12's Open MPI for the GPU machine: its packages' files, unpacked under usr/ and lib/
    local debs=build/device-obj/debs
    mkdir -p "$debs/root"
    (cd "$debs" && apt-get download $MPI_DEBS > ../debs.log 2>&1) ||
        die "apt-get download (Open MPI): $(tail -1 build/device-obj/debs.log)"
    for f in "$debs"/*.deb; do dpkg -x "$f" "$debs/root" || die "dpkg -x $f"; done
    tar -czf "$D/mpi-root.tgz" -C "$debs/root" . || die "packing Open MPI"

    # the benchmark programs, a profiling copy of 124M's, the token shard, llm.c's source
    gen_prog gpt2_124m train_cuda_single gpt2_124m --bf16 --mbs 64
    gen_prog gpt2_1558m train_cuda_single gpt2_1558m --bf16 --mbs 8 \
        --recompute selective
    cp build/device-obj/gpt2_124m.src/train_cuda_single "$D/prog/gpt2_124m"
    cp build/device-obj/gpt2_1558m.src/train_cuda_single "$D/prog/gpt2_1558m"
    local objs wraps="" s
    for s in $PROFILE_WRAP; do wraps="$wraps -Wl,--wrap=$s"; done
    objs=$(sed -n 's/^GEN_SRCS *:= *//p' build/device-obj/gpt2_124m.src/build.mk | tr ' ' '\n' |
           sed '/^$/d; s|^|build/device-obj/gpt2_124m/|; s|\.c$|.o|')
    gcc -std=c11 -O2 -Wall -Wextra -Werror -DPROFILE_CUDA -Iruntime -Ilib \
        -c -o build/device-obj/step_profile.o bench/step_profile.c || die "step_profile.c"
    # shellcheck disable=SC2086,SC2046 # word lists
    gcc -o "$D/prog/gpt2_124m_prof" $objs build/device-obj/step_profile.o $wraps \
        $(mkvar GPT_CUDA_SINGLE_LIBS) || die "linking the profiling program"
    # copies of 124M's program whose tensor-core attention uses tiles of 32 and of 128 queries
    # and keys (FA_TILE; the default is 64; tests/kernels passes with each on the emulation),
    # to time beside the default's; their kernels for sm_90 alone (H100, H200), which keeps
    # build/device within the 64 MiB that travels
    local tile sm90
    sm90=$(mkvar RT_NVCC_FLAGS | sed 's/-gencode arch=compute_80,code=sm_80//
                                      s/-gencode arch=compute_90,code=compute_90//')
    for tile in $FA_TILES; do
        # shellcheck disable=SC2086 # the Makefile's flags are words
        nvcc $sm90 -Ilib -DFA_TILE="$tile" \
            -c -o "build/device-obj/kernels_fa$tile.o" lib/kernels_cuda.cu ||
            die "lib/kernels_cuda.cu with FA_TILE=$tile"
        # shellcheck disable=SC2086,SC2046 # word lists
        gcc -o "$D/prog/gpt2_124m_fa$tile" $objs "build/device-obj/kernels_fa$tile.o" \
            $(mkvar GPT_CUDA_SINGLE_LIBS) || die "linking the FA_TILE=$tile program"
    done
    cp build/ref/make_tokens "$D/bin/"     # the GPT-2 token shard is made there (4 MB less)
    git -C "$llmc" archive HEAD Makefile train_gpt2.cu llmc | tar -x -C "$D/llm.c" ||
        die "llm.c's source"
    # CUDA 13 takes a cudaMemLocation where llm.c passes a device number (its out-of-memory
    # fallback, never taken in these runs): the one change to the carried copy
    local advice='cudaMemAdviseSetPreferredLocation'
    local loc='cudaMemLocation{cudaMemLocationTypeHost, 0}'
    sed -i "s/$advice, cudaCpuDeviceId)/$advice, $loc)/" "$D/llm.c/llmc/cuda_utils.cuh"
    grep -q 'cudaMemLocation{cudaMemLocationTypeHost, 0}' "$D/llm.c/llmc/cuda_utils.cuh" ||
        die "llm.c's cudaMemAdvise call changed: check the CUDA 13 fix in bench/gpu_batch.sh"
    git -C "$llmc" rev-parse HEAD > "$D/llm.c/COMMIT"
    # llm.c built here as its README builds it (make train_gpt2cu), for the GPU it will run on
    # (sm_90: no GPU here to detect it). It links -lnvidia-ml, which is the driver's: without
    # nvml.h here it calls none of it (its GPU-utilisation printout is compiled out), so an
    # empty stub of that name satisfies the link; the GPU machine's driver provides the real
    # one. Link options go in NVCC_LDLIBS, which adds to llm.c's own list (NVCC_LDFLAGS on the
    # command line would replace it and lose -lcublas -lcublasLt).
    mkdir -p build/device-obj/nvml
    echo 'void llmc_nvml_stub(void);' > build/device-obj/nvml/stub.c
    gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o build/device-obj/nvml/libnvidia-ml.so \
        build/device-obj/nvml/stub.c || die "the NVML stub"
    local stub=$PWD/build/device-obj/nvml
    (cd "$D/llm.c" && make train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 USE_CUDNN=0 \
        GPU_COMPUTE_CAPABILITY=90 "NVCC_LDLIBS=-L$stub" \
        > ../llmc-build.log 2>&1) || die "building llm.c: $(grep -m1 -i error "$D/llmc-build.log")"
    rm -rf "$D/llm.c/llmc" "$D/llm.c/train_gpt2.cu" "$D/llm.c/build"
    strip --strip-debug "$D"/bin/* "$D"/prog/*
    tar -czf "$D/prog.tgz" -C "$D" prog && rm -rf "$D/prog"    # 22 MiB of fatbins: 7 packed
    echo "gpu_batch prepared $(git rev-parse --short HEAD)$(git diff --quiet || echo +)" \
        > "$D/VERSION"
    # a device call carries the repository's files with build/device: 64 MiB in all
    local bytes
    bytes=$(( $(du -sb "$D" | cut -f1) +
              $(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1) ))
    [ "$bytes" -le $(( 64 * 1024 * 1024 )) ] ||
        die "$D and the repository's files come to $(( bytes / 1048576 )) MiB: over the 64 MiB" \
            "that a device call carries"
    echo "gpu_batch: $D ready ($(( bytes / 1048576 )) MiB with the repository's files);" \
         "on the GPU machine, with it carried:"
    echo "    bench/gpu_batch.sh run"
}

# -- run (the GPU machine) ----------------------------------------------------------------------
OUTD=${GPU_BATCH_WORK:-/tmp/gpu_batch}
case $OUTD in /*) ;; *) OUTD=$PWD/$OUTD ;; esac            # llm.c runs in its own directory
P=$OUTD/prog                               # the programs, unpacked from build/device/prog.tgz
RESULTS=${OUT:-$D/out}
case $RESULTS in /*) ;; *) RESULTS=$PWD/$RESULTS ;; esac     # pack() runs in $OUTD
FAILS=0
# Each line goes to stdout and to $RESULTS/summary.txt at once, and the logs are packed after
# each part: a command stopped at its time limit still returns what it had done.
note() { echo "$*"; echo "$*" >> "$RESULTS/summary.txt"; }
pack() {
    (cd "$OUTD" && find . -maxdepth 1 \( -name '*.log' -o -name '*.jsonl' \) -print0 |
        tar -czf "$RESULTS/logs.tgz" --null -T -)
}
ok() { note "PASS $1"; }
bad() { note "FAIL $1: $2"; FAILS=$((FAILS + 1)); }

# The CUDA libraries: the toolkit's, or the pip packages' (NCCL often lives only there).
libpath() {
    local extra="" d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        [ -d "$d" ] && extra="$extra:$d"
    done
    d=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)
    [ -n "$d" ] && for l in "$d"/nvidia/*/lib; do [ -d "$l" ] && extra="$extra:$l"; done
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}$extra"
    if ldd "$D/bin/kernel_test_cuda" | grep -q 'not found'; then
        ldd "$D/bin/kernel_test_cuda" | grep 'not found' >&2
        die "CUDA libraries not found (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
    fi
}

part_kernels() {
    local k
    for k in 1 2; do
        # (cuDNN builds a plan per attention shape and pass at its first call: seconds each)
        timeout 150 "$D/bin/kernel_test_cuda" kernels/cuda \
            --dump "$OUTD/k$k.safetensors" --dump-bf16 "$OUTD/k$k-bf16.safetensors" \
            > "$OUTD/kernels-$k.log" 2>&1
        local rc=$?
        if [ $rc -ne 0 ]; then
            bad kernels "kernel_test_cuda exited $rc: $( (grep '^FAIL' "$OUTD/kernels-$k.log" ||
                tail -3 "$OUTD/kernels-$k.log") | head -3 | tr '\n' ' ')"
            return
        fi
    done
    ok "kernels ($(grep -c '^PASS' "$OUTD/kernels-1.log") checks against the reference)"
    # bf16 attention: cuDNN's fused attention (ATTN=cudnn: a refusal is a failure, with
    # cuDNN's reason) and the library's own kernels, each against the reference
    for k in cudnn own; do
        if ATTN=$k timeout 90 "$D/bin/kernel_test_cuda" "kernels/attn-$k" --only attention-bf16 \
                > "$OUTD/kernels-attn-$k.log" 2>&1; then
            ok "kernels-attention-$k"
            # which engines cuDNN chose, and their workspace (ATTN=cudnn logs them)
            [ $k = cudnn ] && note "$(grep -m4 'cuDNN attention' "$OUTD/kernels-attn-$k.log" |
                                      sed 's/^\[rank [0-9/]*\] //')"
        else bad "kernels-attention-$k" "$( (grep -m2 '^FAIL\|ATTN=\|cuDNN' \
            "$OUTD/kernels-attn-$k.log" || tail -2 "$OUTD/kernels-attn-$k.log") | tr '\n' ' ')"
        fi
    done
    if cmp -s "$OUTD/k1.safetensors" "$OUTD/k2.safetensors" &&
       cmp -s "$OUTD/k1-bf16.safetensors" "$OUTD/k2-bf16.safetensors"; then
        ok kernels-deterministic
    else bad kernels-deterministic "two runs differ"; fi
    gunzip -c "$D/ref/kernels-cpu.safetensors.gz" > "$OUTD/kernels-cpu.safetensors"
    if "$D/bin/stcompare" -q --atol 0 --rtol 1e-5 --atol-max 1e-5 "$OUTD/k1.safetensors" \
            "$OUTD/kernels-cpu.safetensors" > "$OUTD/kernels-vs-cpu.log" 2>&1; then
        ok "kernels-vs-cpu ($(tail -1 "$OUTD/kernels-vs-cpu.log"))"
    else bad kernels-vs-cpu "$(tail -1 "$OUTD/kernels-vs-cpu.log")"; fi
    rm -f "$OUTD"/k2*.safetensors "$OUTD"/k1-bf16.safetensors "$OUTD/kernels-cpu.safetensors"
    for k in gemm rng; do
        if timeout 60 "$D/bin/t_${k}_cuda" > "$OUTD/runtime-$k.log" 2>&1 &&
           grep -q '^ok ' "$OUTD/runtime-$k.log"; then
            # t_gemm: how many of its cuBLASLt epilogue cases the library fused
            ok "runtime-$k$(sed -n 's/^rt_gemm_epi: \(.*\) (.*/ (epilogues: \1)/p' \
                "$OUTD/runtime-$k.log")"
        else bad "runtime-$k" "$(grep -m1 -iv '^ok' "$OUTD/runtime-$k.log")"; fi
    done
}

# logcmp A B TOL: tests/logcmp.lua's comparison of two JSON-lines logs (relative tolerance per
# key), in python3: the GPU machine has no Lua
logcmp() {
    python3 - "$@" <<'EOF'
import json, math, sys
a = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
b = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
tol = dict(kv.split("=") for kv in sys.argv[3].split())
if len(a) != len(b):
    sys.exit(f"{len(a)} steps vs {len(b)}")
worst = 0.0
for x, y in zip(a, b):
    for k, t in tol.items():
        u, v = x.get(k), y.get(k)
        if u is None or v is None or not math.isfinite(u):
            sys.exit(f"step {x['step']}: {k} {u} vs {v}")
        r = abs(u - v) / max(abs(v), 1e-30)
        worst = max(worst, r / float(t))
        if r > float(t):
            sys.exit(f"step {x['step']}: {k} {u} vs {v} (relative {r:.3g} > {t})")
print(f"{len(a)} steps, at most {worst:.2f} of the tolerance; "
      f"last loss {a[-1]['loss']:.6f} vs {b[-1]['loss']:.6f}")
EOF
}

part_train() {
    local name out wout
    for name in tiny tiny_llama tiny_bf16 tiny_moe; do
        # shellcheck disable=SC2086 # the flags are words
        if ! timeout 60 "$P/$name" --data "$D/ref/tok.bin" $TRAIN_FLAGS \
                --log "$OUTD/$name.jsonl" --save "$OUTD/$name.safetensors" \
                > "$OUTD/$name.log" 2>&1; then
            bad "train-$name" "train_cuda_single failed: $(tail -2 "$OUTD/$name.log" | tr '\n' ' ')"
            continue
        fi
        local logtol="loss=1e-5 lr=1e-6 grad_norm=1e-5" wtol="--atol 1e-5 --rtol 1e-5"
        if [ $name = tiny_bf16 ]; then
            logtol="loss=2e-4 lr=1e-6 grad_norm=1e-2"
            wtol="--atol 1e-4 --rtol 1e-2 --outliers 5e-3 --hard 5e-3"
        fi
        # shellcheck disable=SC2086 # the tolerances are words
        if ! out=$(logcmp "$OUTD/$name.jsonl" "$D/ref/$name.jsonl" "$logtol" 2>&1); then
            bad "train-$name" "log vs train_single: $out"
        elif ! wout=$("$D/bin/stcompare" -q $wtol "$OUTD/$name.safetensors" \
                "$D/ref/$name.safetensors" 2>&1); then
            bad "train-$name" "weights vs train_single: $(echo "$wout" | tail -1)"
        else ok "train-$name ($out)"; fi
        rm -f "$OUTD/$name.safetensors"
    done
}

# The carried Open MPI, unpacked and relocated (OPAL_PREFIX); launches are local (no ssh) over
# shared memory.
mpi_env() {
    local m=$OUTD/mpi
    rm -rf "$m" && mkdir -p "$m" && tar -xzf "$D/mpi-root.tgz" -C "$m" ||
        die "cannot unpack $D/mpi-root.tgz"
    local lib=$m/usr/lib/x86_64-linux-gnu
    export OPAL_PREFIX=$m/usr OPAL_LIBDIR=$lib/openmpi/lib OPAL_DATADIR=$m/usr/share/openmpi
    export OPAL_PKGDATADIR=$m/usr/share/openmpi PATH=$m/usr/bin:$PATH
    export LD_LIBRARY_PATH=$lib:$lib/openmpi/lib:$m/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
    export OMPI_MCA_plm_rsh_agent=false OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
    export PMIX_MCA_pcompress_base_silence_warning=1
}

part_multi() {
    mpi_env
    local name args ranks ref="" out wout mf="--data $D/ref/tok.bin $TRAIN_FLAGS"
    while IFS='|' read -r name args ranks; do
        # shellcheck disable=SC2086 # the flags are words
        if ! timeout 90 mpirun.openmpi --allow-run-as-root --oversubscribe -np "$ranks" \
                "$P/$name" $mf --log "$OUTD/$name.jsonl" --save "$OUTD/$name.safetensors" \
                > "$OUTD/$name.log" 2>&1 < /dev/null; then
            bad "multi-$name" "$ranks ranks: $(tail -2 "$OUTD/$name.log" | tr '\n' ' ')"
        elif [ "$ranks" = 1 ]; then
            ref=$name                            # the reference of the layouts that follow
            ok "multi-$name (the single-rank reference)"
        elif ! out=$(logcmp "$OUTD/$name.jsonl" "$OUTD/$ref.jsonl" \
                "loss=1e-5 grad_norm=1e-5$(grep -q aux_loss "$OUTD/$ref.jsonl" &&
                                            echo ' aux_loss=1e-5')" 2>&1); then
            bad "multi-$name" "log vs $ref: $out"
        elif ! wout=$("$D/bin/stcompare" -q --atol 1e-6 --rtol 1e-5 --outliers 1e-3 --hard 1e-4 \
                "$OUTD/$name.safetensors" "$OUTD/$ref.safetensors" 2>&1); then
            bad "multi-$name" "weights vs $ref: $(echo "$wout" | tail -1)"
        else ok "multi-$name ($ranks ranks on one GPU over MPI: $out)"; fi
    done <<< "$MULTI"
}

# median of the field F over the JSON-lines log's steps after the warm-up
jmedian() {
    python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][int(sys.argv[3]):]
print(statistics.median(r[sys.argv[2]] for r in rows) if rows else "nan")' "$@"
}

# llm.c's step lines: "step N/M | loss ... | ... | X ms | Y% bf16 MFU | Z tok/s" (its tok/s is
# a moving average, so ours and its are both computed from the median ms)
llmc_median() {     # LOG FIELD(ms) WARMUP
    python3 -c '
import re, statistics, sys
v = [float(m.group(1)) for l in open(sys.argv[1]) if l.startswith("step")
     for m in [re.search(r"\|\s*([0-9.]+) ms", l)] if m][int(sys.argv[3]):]
print(statistics.median(v) if v else "nan")' "$@"
}

tokps() { python3 -c 'import sys; b, ms = map(float, sys.argv[1:]); print(b * 1024e3 / ms)' "$@"; }

# mfu TOKS_PER_S LAYERS HIDDEN SEQ VOCAB: 6N + 6LCT FLOPs per token over 989 TFLOP/s, in %
mfu() {
    python3 -c '
import sys
t, L, C, T, V = (float(x) for x in sys.argv[1:])
N = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
print(f"{100 * t * (6 * N + 6 * L * C * T) / 989e12:.1f}" if t == t else "nan")' "$@"
}

# bench_model NAME LAYERS HIDDEN B LLMC-DESCRIPTOR: our program and llm.c, each BENCH_STEPS steps
bench_model() {
    local W=${BENCH_WARMUP:-3} shard=$OUTD/gpt2_tokens.bin rows="" toks ms lt lms mem
    timeout 150 "$P/$1" --data "$OUTD/gpt2_tokens.bin" --steps "$BENCH_STEPS" \
        --lr 6e-4 --warmup 2 --quiet --log "$OUTD/$1.jsonl" > "$OUTD/$1.log" 2>&1 ||
        bad "bench-$1" "our program failed: $(tail -2 "$OUTD/$1.log" | tr '\n' ' ')"
    mem=$(grep -m1 '^memory:' "$OUTD/$1.log")
    [ -n "$mem" ] && note "$1: $mem"
    # which attention ran: cuDNN's unless the program said why not
    note "$1: attention: $(grep -m1 'cuDNN' "$OUTD/$1.log" || echo "cuDNN's fused attention")"
    ms=$(jmedian "$OUTD/$1.jsonl" ms "$W" 2>/dev/null || echo nan)
    toks=$(tokps "$4" "$ms")
    rows="$(printf '%-11s %-7s %4s %10.1f %10.0f %6s' "$1" ours "$4" "$ms" "$toks" \
        "$(mfu "$toks" "$2" "$3" 1024 50257)")"
    # llm.c: random init (-e d12 / d48), no validation, sampling or HellaSwag; its defaults
    # otherwise (GELU recompute, no ZeRO)
    (cd "$D/llm.c" && timeout 150 ./train_gpt2cu -i "$shard" -j "$shard" -e "$5" -b "$4" -t 1024 \
        -d $(( $4 * 1024 )) -x "$BENCH_STEPS" -v 100000 -s 100000 -h 0 \
        > "$OUTD/llmc-$1.log" 2>&1) ||
        bad "bench-$1-llmc" "llm.c failed: $(tail -2 "$OUTD/llmc-$1.log" | tr '\n' ' ')"
    lms=$(llmc_median "$OUTD/llmc-$1.log" ms "$W")
    lt=$(tokps "$4" "$lms")
    rows="$rows"$'\n'"$(printf '%-11s %-7s %4s %10.1f %10.0f %6s' "$1" llm.c "$4" "$lms" "$lt" \
        "$(mfu "$lt" "$2" "$3" 1024 50257)")"
    note ""
    note "$(printf '%-11s %-7s %4s %10s %10s %6s' model program B ms/step tok/s MFU%)"
    note "$rows"
}

part_bench() {
    bench_model gpt2_124m 12 768 64 d12
    # the library's own attention kernels (ATTN=own): at their default tiles, and at the other
    # tile sizes (FA_TILE); time only
    local tile ms toks prog row
    for tile in 64 $FA_TILES; do
        prog=gpt2_124m_fa$tile row=own-fa$tile
        [ "$tile" = 64 ] && prog=gpt2_124m row=own
        ATTN=own timeout 100 "$P/$prog" --data "$OUTD/gpt2_tokens.bin" \
            --steps "$BENCH_STEPS" --lr 6e-4 --warmup 2 --quiet \
            --log "$OUTD/gpt2_124m_$row.jsonl" > "$OUTD/gpt2_124m_$row.log" 2>&1 ||
            bad "bench-gpt2_124m-$row" "$(tail -2 "$OUTD/gpt2_124m_$row.log" | tr '\n' ' ')"
        # the same model, data and steps: the losses agree to bf16's rounding (1e-2 relative;
        # an attention or a tile size that breaks it moves them by far more)
        python3 -c '
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f) if l.strip()] for f in sys.argv[1:])
bad = [i for i, (x, y) in enumerate(zip(a, b)) if not abs(x - y) <= 1e-2 * abs(y)]
sys.exit(f"losses differ from the first row'"'"'s at steps {bad}" if bad or len(a) != len(b)
         else 0)' "$OUTD/gpt2_124m_$row.jsonl" "$OUTD/gpt2_124m.jsonl" \
            > "$OUTD/gpt2_124m_$row.cmp" 2>&1 ||
            bad "bench-gpt2_124m-$row-loss" "$(tail -1 "$OUTD/gpt2_124m_$row.cmp")"
        ms=$(jmedian "$OUTD/gpt2_124m_$row.jsonl" ms "${BENCH_WARMUP:-3}" 2>/dev/null ||
             echo nan)
        toks=$(tokps 64 "$ms")
        note "$(printf '%-11s %-7s %4s %10.1f %10.0f %6s' gpt2_124m "$row" 64 "$ms" "$toks" \
            "$(mfu "$toks" 12 768 1024 50257)")"
    done
}
part_big() { bench_model gpt2_1558m 48 1600 8 d48; }

# transformers loads our exports (train --save DIR) from their files alone, in float64, and
# computes the training program's loss on the same tokens (tests/hfload/hf_transformers.py)
part_hf() {
    local name out
    for name in tiny tiny_llama; do
        # shellcheck disable=SC2046 # GBS T LOSS are words
        if out=$(timeout 120 python3 tests/hfload/hf_transformers.py "$D/hf/$name" \
                "$D/ref/tok.bin" $(cat "$D/hf/$name.args") 2>&1); then
            ok "hf-$name: $(echo "$out" | tail -n 1)"
        else
            bad "hf-$name" "$(echo "$out" | tail -n 2 | tr '\n' ' ')"
        fi
    done
}

# the card's ceilings as found (PyTorch): a bf16 8192^3 product on random data and a 4 GiB
# device-to-device copy, each the median of 10 after 3 warm-ups, timed with CUDA events
part_peak() {
    timeout 90 python3 - > "$OUTD/peak.log" 2>&1 <<'PY'
import torch, statistics
def t(f, n=10):
    for _ in range(3): f()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)
n = 8192
x, y = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
ms = t(lambda: x @ y)
print(f"peak: bf16 GEMM {2 * n**3 / ms / 1e9:.0f} TFLOP/s", end="; ")
src = torch.empty(1 << 31, device="cuda", dtype=torch.int16); dst = torch.empty_like(src)
ms = t(lambda: dst.copy_(src))
print(f"copy {2 * src.numel() * 2 / ms / 1e9:.2f} TB/s (read + write)")
PY
    if grep -q '^peak:' "$OUTD/peak.log"; then note "$(grep '^peak:' "$OUTD/peak.log")"
    else bad peak "$(tail -1 "$OUTD/peak.log")"; fi
}

part_profile() {
    PROFILE_WARMUP=2 timeout 120 "$P/gpt2_124m_prof" --data "$OUTD/gpt2_tokens.bin" \
        --steps 8 --lr 6e-4 --warmup 2 --quiet > "$OUTD/profile.log" 2>&1 ||
        bad profile "$(tail -2 "$OUTD/profile.log" | tr '\n' ' ')"
    note ""
    note "GPT-2 124M, bf16, B 64, T 1024: ms per step by kernel family (synchronised calls)"
    note "$(grep '^profile:' "$OUTD/profile.log" | sed 's/^profile: //')"
    note ""
    note "$(python3 bench/cost_model.py 124m --profile "$OUTD/profile.log" 2>&1)"
}

run() {
    [ -f "$D/VERSION" ] || die "no $D: run 'bench/gpu_batch.sh prepare' here first and carry $D"
    rm -rf "$OUTD" && mkdir -p "$OUTD" "$RESULTS" || exit 1
    rm -f "$RESULTS/summary.txt" "$RESULTS/logs.tgz"
    tar -xzf "$D/prog.tgz" -C "$OUTD" || die "cannot unpack $D/prog.tgz"
    "$D/bin/make_tokens" --vocab 50257 --tokens 2000000 --shard "$OUTD/gpt2_tokens.bin" \
        > /dev/null || die "make_tokens (the GPT-2 token shard)"
    libpath
    note "$(cat "$D/VERSION"); $(nvidia-smi -L 2>/dev/null | head -1); driver $(nvidia-smi \
        --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1); CPU $(sed -n \
        's/^model name[^:]*: //p' /proc/cpuinfo | head -1)"
    local parts=${*:-peak kernels train hf bench profile multi big} p
    for p in $parts; do
        case $p in
        peak|kernels|train|hf|bench|profile|multi|big)
            note "-- $p ($(date +%T))"; "part_$p"; pack ;;
        *) die "unknown part '$p' (peak kernels train hf bench profile multi big)" ;;
        esac
    done
    note ""
    note "gpu_batch: $FAILS failed"
    [ $FAILS = 0 ]
}

case $MODE in
prepare) prepare ;;
run) run "$@" ;;
*) echo "usage: bench/gpu_batch.sh prepare | run [peak kernels train hf bench profile multi big]" >&2
   exit 2 ;;
esac
