#!/bin/bash
# tests/kernels/suite.sh: the library's kernels in both storage dtypes (f32, bf16) against the
# double-precision reference's single ops (tests/kernels/kernel_test.c, tolerances stated
# there), at thread counts 1 and 2 with bit-identical results, a set of deliberately broken
# kernels that the test must catch, and the CUDA kernels: built (and linked) whenever the CUDA
# backend is, run and compared with the CPU results only where a GPU is present. Scratch:
# build/test/kernels/. Run from the repository root by tests/run.sh (docs/DESIGN.md §3).
. "$(dirname "$0")/../lib.sh" kernels
MK="make -s --no-print-directory -f Makefile -f tests/kernels/kernels.mk KT_BUILD=$S"

# -- Build: the library's kernels (lib/; sizes are arguments) -------------------------------------
if ! make -s --no-print-directory build/librt_cpu.a ref build/tools/stcompare \
        > $S/build.log 2>&1; then
    sed 's/^/  /' $S/build.log | tail -20
    fail build "make librt_cpu.a ref stcompare failed"
    finish
fi
if ! $MK kernel-test > $S/build.log 2>&1; then
    sed 's/^/  /' $S/build.log | tail -20
    fail build "kernel_test_cpu does not compile (warnings are errors)"
    finish
fi
pass build

# -- CPU: against the reference, one and two threads --------------------------------------------
run_cpu() {     # threads
    out=$S/cpu-t$1.out
    RT_THREADS=$1 RT_TIMEOUT=120 $S/kernel_test_cpu kernels/cpu-t$1 \
        --dump $S/cpu-t$1.safetensors --dump-bf16 $S/cpu-t$1-bf16.safetensors > $out 2>&1
    rc=$?
    cat $out
    if [ $rc -ne 0 ] && ! grep -q '^FAIL ' $out; then
        fail cpu-t$1 "kernel_test_cpu exited with status $rc"
    fi
    [ $rc -eq 0 ]
}
ok1=0; ok2=0
run_cpu 1 && ok1=1
run_cpu 2 && ok2=1
FAILED=$(( FAILED | ! (ok1 & ok2) ))

# Every CPU kernel partitions rows, columns or (batch, head, tile) tasks, each element summed in
# a fixed order: the results must not depend on the thread count, bit for bit, in both dtypes.
for d in f32 bf16; do
    sfx=; [ $d = bf16 ] && sfx=-bf16
    if [ $ok1 = 1 ] && [ $ok2 = 1 ]; then
        if cmp -s $S/cpu-t1$sfx.safetensors $S/cpu-t2$sfx.safetensors; then
            pass threads-identical-$d
        else
            build/tools/stcompare --exact -q $S/cpu-t1$sfx.safetensors \
                $S/cpu-t2$sfx.safetensors | head -20
            fail threads-identical-$d "$d outputs with RT_THREADS=1 and 2 differ"
        fi
    else
        skip threads-identical-$d "the CPU runs failed"
    fi
done

# -- Mutants: each broken kernel must make kernel_test fail --------------------------------------
# name | the op whose checks catch it | sed expression on the kernel sources | a line it must
# produce (proof that it applied). A mutant runs only that op's checks (kernel_test --only, on
# the inputs the whole test gives them) up to the first that fails (--first): a mutant needs
# one failing check to be caught. Two mutants are built and run at a time (each in its own
# directory); verdicts in order. mutate_cuda: the same on kernels_cuda.cu, run on the CUDA
# emulation (kernel_test_emu).
MUTANTS=""
EMU=0           # can the CUDA emulation be built here (g++, x86-64)?
command -v g++ >/dev/null 2>&1 && [ "$(uname -m)" = x86_64 ] && EMU=1
# the emulation's scheduler, which every CUDA mutant links: built once, before they run in pairs
if [ $EMU = 1 ] && ! $MK build/emu/cuda_emu.o > $S/build-emu-sched.log 2>&1; then
    fail cuda-emu-sched "tests/kernels/emu/cuda_emu.cc: $(tail -1 $S/build-emu-sched.log)"
    EMU=0
fi
pool_start 2
launch_mutant() {   # kind name op expr proof
    MUTANTS="$MUTANTS $2"
    pool_add mutant_job "$@"
}
mutant_job() {
    tokens_take
    mutate_one "$@" > "$S/mutant-$2.verdict" 2>&1
    tokens_give
}
mutate() { launch_mutant cpu "$@"; }
kernel_sources() {  # DIR: a fresh copy of the kernels' sources in DIR/src
    rm -rf "$1" && mkdir -p "$1/src" &&
        cp lib/kernels_cpu.c lib/kernels_cuda.cu lib/kernel_rows.h lib/attn_cudnn.cu "$1/src/"
}
# variant NAME OP FLAGS: kernels_cuda.cu built with FLAGS (a compile-time size that
# bench/gpu_batch.sh times on a GPU) must pass every check of OP on the emulation
variant() {
    MUTANTS="$MUTANTS $1"
    pool_add variant_job "$@"
}
variant_job() {
    tokens_take
    variant_one "$@" > "$S/mutant-$1.verdict" 2>&1
    tokens_give
}
variant_one() {
    name=$1 op=$2 flags=$3
    d=$S/mutant-$name
    kernel_sources $d
    if ! $MK KT_SRC=$d/src KT_BUILD=$d KT_EXTRA="$flags" LIB_OPT=-O1 KT_TEST=$S/kernel_test.o \
            kernel-test-emu > $d/build.log 2>&1; then
        sed 's/^/  /' $d/build.log | tail -5
        fail "$name" "kernels_cuda.cu does not compile with $flags"
        return
    fi
    if ATTN=own RT_THREADS=1 RT_TIMEOUT=120 $d/kernel_test_emu kernels/$name --only $op \
            > $d/run.out 2>&1
    then pass "$name ($flags: $op)"
    else fail "$name" "with $flags: $(grep -m1 '^FAIL ' $d/run.out || tail -1 $d/run.out)"; fi
}
mutate_cuda() { launch_mutant emu "$@"; }
# mutate_cudnn: the same on attn_cudnn.cu (cuDNN's graphs), run on the emulated cuDNN
mutate_cudnn() { launch_mutant cudnn "$@"; }
mutate_one() {
    kind=$1 name=$2 op=$3 expr=$4 proof=$5
    d=$S/mutant-$name
    kernel_sources $d
    # the sources mutated, what make builds from them, the program, the attention it runs
    case $kind in
    cpu) files="$d/src/kernels_cpu.c $d/src/kernel_rows.h" src="KT_SRC=$d/src" prog=cpu attn= ;;
    emu) files=$d/src/kernels_cuda.cu src="KT_SRC=$d/src" prog=emu attn=own ;;
    cudnn) files=$d/src/attn_cudnn.cu src="KT_CUDNN_SRC=$d/src" prog=emu attn=cudnn ;;
    esac
    sed -i "$expr" $files
    if ! cat $files | grep -qF "$proof"; then
        fail mutant-$name "the mutation no longer applies (the kernel source changed?)"
        return
    fi
    # -O1, no debug information: a mutant only has to be caught, not to be fast
    if ! $MK $src KT_BUILD=$d KT_EXTRA="-Wno-error -g0" LIB_OPT=-O1 \
            KT_TEST=$S/kernel_test.o kernel-test-$prog \
            > $d/build.log 2>&1; then
        sed 's/^/  /' $d/build.log | tail -5
        fail mutant-$name "the mutant does not compile"
        return
    fi
    # one thread each (two mutants run at a time); the op's first failing check is enough
    ATTN=$attn RT_THREADS=1 RT_TIMEOUT=60 $d/kernel_test_$prog kernels/mutant --first \
        --only $op > $d/run.out 2>&1
    caught=$(grep '^FAIL ' $d/run.out | sed 's/^FAIL kernels\/mutant\/\([^:]*\):.*/\1/' |
             tr '\n' ' ' | sed 's/ $//')
    if [ -n "$caught" ]; then pass "mutant-$name (caught by: $caught)"
    else fail mutant-$name "a broken kernel passed every check of $op"; fi
}
mutate layernorm-unbiased-var layernorm-f32 \
    's|v /= (float)C;|v /= (float)(C - 1);|' 'v /= (float)(C - 1);'
mutate pos-offset-ignored embed_pos-f32 's|wpe + (size_t)(t0 + t) \* C|wpe + (size_t)t * C|' \
    'wpe + (size_t)t * C'
mutate gelu-grad gelu-f32 's|3.0f \* GELU_CUBE|GELU_CUBE|' 'GELU_SCALE * (1.0f + GELU_CUBE'
mutate bias-bwd-last-column bias-f32 's|MIN(hi \* COLS, a->OC)|MIN(hi * COLS, a->OC - 1)|' \
    'MIN(hi * COLS, a->OC - 1)'
mutate ce-padding-kept crossentropy-f32 \
    '/for (int j = valid; j < Vl; j++) row\[j\] = KR_ST(0.0f);/d' \
    'row[j] = KR_ST((p - (j == t ? 1.0f : 0.0f)) * dloss);'
mutate ce-target-not-owned crossentropy-f32 \
    's|? KR_LD(row\[t\]) : 0.0f;|? KR_LD(row[t]) : KR_LD(row[0]);|' \
    '? KR_LD(row[t]) : KR_LD(row[0]);'
mutate ce-padding-in-max crossentropy-f32 's|j < valid; j++) m = |j < valid + 1; j++) m = |' \
    'j < valid + 1; j++) m ='
mutate adamw-eps-inside-sqrt adamw-f32 's|sqrtf(\*v) / bc2_sqrt + eps|sqrtf(*v + eps) / bc2_sqrt|' \
    'sqrtf(*v + eps) / bc2_sqrt'
mutate adamw-decay-without-lr adamw-f32 \
    's|\*p \*= 1.0f - lr \* wd;|*p *= 1.0f - wd;|' '*p *= 1.0f - wd;'
mutate embed-bwd-unowned embed_pos-f32 \
    's|if (v < 0 \|\| v >= vrows) continue;|if (v < 0) continue;|' \
    'if (v < 0) continue;'
mutate sumsq-first-skipped sumsq 's|size_t n = i1 - i0, i = 0;|size_t n = i1 - i0, i = 1;|' \
    'size_t n = i1 - i0, i = 1;'
mutate bf16-round-truncates convert 's|(u + 0x7fffu + ((u >> 16) \& 1u)) >> 16|u >> 16|' \
    'uint32_t rounded = u >> 16;'
# attention: the causal mask, the tiles skipped, the online softmax, the saved statistics, the
# backward's sums over tiles
mutate attention-fwd-diagonal-unmasked attention-f32 \
    's|const int cmask_fwd = diag ? c : 0;|const int cmask_fwd = 0;|' 'const int cmask_fwd = 0;'
mutate attention-bwd-diagonal-unmasked attention-f32 \
    's|const int cmask = diag ? c : 0;|const int cmask = 0;|' \
    'const int cmask = 0;'
mutate attention-first-tile-skipped attention-f32 \
    's|for (int kj = 0; kj < whole; kj++)|for (int kj = qi > 0; kj < whole; kj++)|' \
    'for (int kj = qi > 0; kj < whole; kj++)'
# context-parallel blocks: the merge of a block into the running output, the full blocks
mutate attention-merge-unweighted attention_cp-f32 \
    's|acc\[d\] = acc\[d\] \* w0 + on\[i \* hdp + d\] \* w1;|acc[d] += on[i * hdp + d] * inv;|' \
    'acc[d] += on[i * hdp + d] * inv;'
mutate attention-block-full-as-causal attention_cp-f32 \
    's|int whole = a->causal ? qi : a->nkt;|int whole = qi;|
     s|int last = a->causal ? qi : a->nkt - 1;|int last = qi;|' 'int whole = qi;'
mutate attention-no-rescale attention-f32 '/on\[i \* hdp + d\] \*= alpha;/d' 'l[i] *= alpha;'
mutate attention-lse-without-max attention-f32 \
    's|return m + logf(l);|return logf(l);|' 'return logf(l);'
mutate attention-dkdv-missing-query-tile attention-f32 \
    's|hdp, AT, hdp, nq);|hdp, AT, hdp, qi ? nq : 0);|' \
    'hdp, AT, hdp, qi ? nq : 0);'
# the Llama layer: RMSNorm's input gradient, the rotary angle's precision and direction, the
# sigmoid where exp(-g) overflows
mutate rmsnorm-dinp-unprojected rmsnorm-f32 \
    's|return dx + rstd \* (g - xhat \* gx_mean);|return dx + rstd * g;|' 'return dx + rstd * g;'
mutate rope-angle-in-f32 rope-f32 \
    's|double a = (double)pos \* inv;|double a = (float)pos * (float)inv;|' \
    'double a = (float)pos * (float)inv;'
mutate rope-inverse-ignored rope-f32 \
    's|(inverse ? -sin(a) : sin(a))|(sin(a))|' '*s = (float)(sin(a));'
mutate swiglu-sigmoid-unguarded swiglu-f32 's|return g < -EXP_MAX ? 0.0f : s;|return s + 0.0f;|' \
    'return s + 0.0f;'
# grouped-query attention: query head h read kv head h % KVl (not h / group); a kv head's dk
# and dv summed over its group's first query head only
mutate gqa-kv-head-modulo attention-f32 's|return h / (Hl / KVl);|return h % KVl;|' \
    'return h % KVl;'
mutate gqa-dkdv-first-head-only attention-f32 \
    's|for (int j = 1; j < a->grp; j++) {|for (int j = 1; j < 1; j++) {|' \
    'for (int j = 1; j < 1; j++) {'
# the fused residual add and norm normalising their input a instead of the sum they stored
mutate add-norm-of-input add_norm-f32 's|a->rstd, a->res, a->w|a->rstd, a->a, a->w|' \
    'a->rstd, a->a, a->w'
# the CUDA kernels' own reductions, on the emulation: a row skipped by the unrolled column loop,
# a butterfly one step short, a block's warps not all added, the embedding's id slices not
# sorted or the last one short, the fused cross-entropy's running sum not rescaled, a
# multi-tensor AdamW block given to the previous tensor, a gradient-norm part left out,
# cross-entropy padding given a gradient, a lane's 16-byte group of a row short of a column
if [ $EMU = 1 ]; then
mutate_cuda cuda-col-unroll-short layernorm-f32 \
    's|u < COL_UNROLL; u++) f(n|u < COL_UNROLL - 1; u++) f(n|' \
    'u < COL_UNROLL - 1; u++) f(n'
mutate_cuda cuda-warp-sum-short layernorm-f32 's|off > 0; off /= 2) v +=|off > 1; off /= 2) v +=|' \
    'off > 1; off /= 2) v +='
mutate_cuda cuda-block-first-warp crossentropy-f32 \
    's|w < nw; w++) r = op|w < 1; w++) r = op|' 'w < 1; w++) r = op'
mutate_cuda cuda-embed-sort-short embed_pos-f32 's|half > 0; half /= 2)|half > 1; half /= 2)|' \
    'half > 1; half /= 2)'
mutate_cuda cuda-embed-scan-total embed_pos-f32 's|start\[vrows\] = acc;|start[vrows] = acc - 1;|' \
    'start[vrows] = acc - 1;'
mutate_cuda cuda-sumsq-part-skipped sumsq 's|i < parts; i += WARP|i < parts - 1; i += WARP|' \
    'i < parts - 1; i += WARP'
mutate_cuda cuda-ce-fused-no-rescale crossentropy-f32 \
    's|e = m == -INFINITY ? 0.0f : e \* vexpf(m - x);|e = m == -INFINITY ? 0.0f : e;|' \
    'e = m == -INFINITY ? 0.0f : e;'
mutate_cuda cuda-adamw-multi-tensor-shifted adamw-f32 \
    's|while (b >= c.first\[k + 1\]) k++;|while (b > c.first[k + 1]) k++;|' \
    'while (b > c.first[k + 1]) k++;'
mutate_cuda cuda-ce-padding-grad crossentropy-f32 \
    's|if (j < valid) g = (vexpf|if (j < Vl) g = (vexpf|' \
    'if (j < Vl) g = (vexpf'
# the tensor-core attention (bf16, head sizes 32, 64, 128): the online softmax's rescale, the
# order of the probabilities' bf16 pairs, the diagonal key tile of dk and dv, dq's scale, the m16n8k16
# operand layout; a column reduction's row chunk left out of the total
mutate_cuda cuda-fa-no-rescale attention-bf16 \
    's|o\[n\]\[i\] \*= alpha\[i / 2\];|o[n][i] *= 1.0f;|' 'o[n][i] *= 1.0f;'
mutate_cuda cuda-fa-pair-swapped attention-bf16 \
    's|return fa_pack(__float2bfloat16_rn(x), __float2bfloat16_rn(y));|return fa_pack(__float2bfloat16_rn(y), __float2bfloat16_rn(x));|' \
    'return fa_pack(__float2bfloat16_rn(y), __float2bfloat16_rn(x));'
mutate_cuda cuda-fa-dkdv-diagonal-skipped attention-bf16 \
    's|q0 = k0; q0 < a.Tq;|q0 = k0 + FA_TILE; q0 < a.Tq;|' \
    'q0 = k0 + FA_TILE; q0 < a.Tq;'
mutate_cuda cuda-fa-dq-unscaled attention-bf16 \
    's|ldg, nr, dq, hd, a.scale, lane);|ldg, nr, dq, hd, 1.0f, lane);|' \
    'ldg, nr, dq, hd, 1.0f, lane);'
mutate_cuda cuda-fa-kv-head-modulo attention-bf16 \
    's|int C = a.Hl \* hd, kh = att_kv_head(h, a.Hl, a.KVl);|int C = a.Hl * hd, kh = h % a.KVl;|' \
    'kh = h % a.KVl;'
mutate_cuda cuda-fa-dkdv-group-first-head attention-bf16 \
    's|const fa_head f = fa_head_at(a, hd, b, h);|const fa_head f = fa_head_at(a, hd, b, kh * grp);|' \
    'const fa_head f = fa_head_at(a, hd, b, kh * grp);'
mutate_cuda cuda-fa-fragment-order attention-bf16 \
    's|a\[1\] = fa_ld(p, (g + 8) \* ld + c);|a[1] = fa_ld(p, g * ld + c + 8);|' \
    'a[1] = fa_ld(p, g * ld + c + 8);'
mutate_cuda cuda-col-chunk-dropped layernorm-f32 \
    's|for (int y = 1; y < chunks; y++)|for (int y = 2; y < chunks; y++)|' \
    'for (int y = 2; y < chunks; y++)'
mutate_cuda cuda-layernorm-group-short layernorm-bf16 \
    's|for (int e = 0; e < k; e++) sum += kr_load(xv + e);|for (int e = 1; e < k; e++) sum += kr_load(xv + e);|' \
    'for (int e = 1; e < k; e++) sum += kr_load(xv + e);'
# the fused residual add and norm: the norm's row read from a, not from the sum just stored
mutate_cuda cuda-add-norm-of-input add_norm-f32 \
    's|rstd, as<S>(res) + r0, as<S>(w)|rstd, as<S>(a) + r0, as<S>(w)|' 'rstd, as<S>(a) + r0, as<S>(w)'
# a conversion's 16-byte group (copy_cols between aligned rows) with its first element left out
mutate_cuda cuda-copy-cols-group-short copy_cols \
    's|for (int j = 0; j < CVT; j++) kr_store(y + j, kr_load(x + j));|for (int j = 1; j < CVT; j++) kr_store(y + j, kr_load(x + j));|' \
    'for (int j = 1; j < CVT; j++) kr_store(y + j'
# cuDNN's attention graphs (attn_cudnn.cu, on the emulated cuDNN): an engine with cuDNN's
# NONDETERMINISTIC note taken (the emulation's reorders its sums from one call to the next), the
# causal mask left out, the row sum of dout * out added instead of subtracted, dq's scale lost
mutate_cudnn cudnn-nondeterministic-engine attention-bf16 \
    's|        if (!det) {|        if (0 \&\& !det) {|' 'if (0 && !det) {'
mutate_cudnn cudnn-no-causal-mask attention-bf16 \
    's|cudnnBackendDescriptor_t sm = causal(g, a, ss, x.neg_inf);|cudnnBackendDescriptor_t sm = ss;|' \
    'cudnnBackendDescriptor_t sm = ss;'
mutate_cudnn cudnn-dsum-added attention-bf16 \
    's|pw2(g, CUDNN_POINTWISE_SUB, dp, dsum, dd);|pw2(g, CUDNN_POINTWISE_ADD, dp, dsum, dd);|' \
    'pw2(g, CUDNN_POINTWISE_ADD, dp, dsum, dd);'
mutate_cudnn cudnn-dq-unscaled attention-bf16 \
    's|pw2(g, CUDNN_POINTWISE_MUL, dpp, scale, ds);|pw2(g, CUDNN_POINTWISE_MUL, dpp, one, ds);|' \
    'pw2(g, CUDNN_POINTWISE_MUL, dpp, one, ds);'
# the tensor-core attention's other tile sizes, which the device batch times
variant cuda-fa-tile-32 attention-bf16 -DFA_TILE=32
variant cuda-fa-tile-128 attention-bf16 -DFA_TILE=128
fi
pool_wait
for name in $MUTANTS; do
    cat "$S/mutant-$name.verdict"
    grep -q '^FAIL ' "$S/mutant-$name.verdict" && FAILED=1
done

# cuDNN refusing every plan (the emulated plans made to need 1 GiB of workspace, more than the
# runtime's 32 MiB): by default the own kernels run, after one line per shape and pass saying
# why; ATTN=cudnn ends the job with that reason; a bad ATTN is named.
cudnn_refusals() {
    local why="of the 2 engine configurations cuDNN proposed, 1 is nondeterministic, 1 needs"
    why="$why more workspace than the memory plan's 33554432 bytes (1073741824 bytes at least),"
    why="$why 0 did not finalise"
    local shape="the attention forward of B 2, T 67, 3 heads (3 kv), head size 64" out
    out=$(CUDNN_EMU_WORKSPACE=1073741824 RT_THREADS=1 RT_TIMEOUT=300 $S/kernel_test_emu \
          kernels/cudnn-refused --only attention-bf16 2>&1)
    if [ $? = 0 ] && echo "$out" | grep -qF "cuDNN refuses $shape ($why): the library's kernels"
    then pass cudnn-refused-falls-back
    else fail cudnn-refused-falls-back "$(echo "$out" | grep -m2 'FAIL\|cuDNN\|rank')"; fi
    out=$(ATTN=cudnn CUDNN_EMU_WORKSPACE=1073741824 RT_TIMEOUT=60 $S/kernel_test_emu \
          kernels/cudnn-refused --only attention-bf16 2>&1)
    if [ $? != 0 ] && echo "$out" | grep -qF "ATTN=cudnn: cuDNN refuses $shape: $why"
    then pass cudnn-refused-required
    else fail cudnn-refused-required "$(echo "$out" | grep -m2 'FAIL\|cuDNN\|rank\|PASS')"; fi
    out=$(ATTN=cuDNN RT_TIMEOUT=60 $S/kernel_test_emu kernels/attn --only attention-bf16 2>&1)
    if [ $? != 0 ] && echo "$out" | grep -qF \
            "ATTN=cuDNN: expected cudnn (cuDNN's fused attention) or own (the library's kernels)"
    then pass attn-bad-value
    else fail attn-bad-value "$(echo "$out" | grep -m2 'FAIL\|ATTN\|rank\|PASS')"; fi
}

# -- CUDA kernels on the CPU emulation of CUDA (tests/kernels/emu): every machine -----------------
# kernels_cuda.cu's own code (indexing, shared memory, barriers, warp shuffles, launch shapes)
# compiled with g++ against the emulation and run against the reference like the CPU kernels;
# the emulation aborts on deadlocks, bad shuffle masks and launch shapes over the H100's limits.
# It proves the kernels' logic, not their speed, nor nvcc's code generation.
run_emu() {     # run number
    RT_THREADS=1 RT_TIMEOUT=300 $S/kernel_test_emu kernels/cuda-emu \
        --dump $S/emu-$1.safetensors --dump-bf16 $S/emu-$1-bf16.safetensors > $S/emu-$1.out 2>&1
}
if [ $EMU = 0 ]; then
    skip cuda-emu-build "needs g++ (make deps installs it) and x86-64 (the fiber switch)"
elif ! $MK kernel-test-emu > $S/build-emu.log 2>&1; then
    sed 's/^/  /' $S/build-emu.log | tail -20
    fail cuda-emu-build "kernels_cuda.cu does not compile against the CUDA emulation"
else
    pass cuda-emu-build
    run_emu 1; rc=$?
    cat $S/emu-1.out
    if [ $rc -ne 0 ]; then
        grep -q '^FAIL ' $S/emu-1.out || fail cuda-emu "kernel_test_emu exited with status $rc"
        FAILED=1
    else
        run_emu 2
        if cmp -s $S/emu-1.safetensors $S/emu-2.safetensors &&
           cmp -s $S/emu-1-bf16.safetensors $S/emu-2-bf16.safetensors; then
            pass cuda-emu-deterministic
        else fail cuda-emu-deterministic "two runs of the emulated CUDA kernels differ"; fi
        # bf16 attention went to cuDNN (emulated) in those runs: the library's own kernels too
        ATTN=own RT_THREADS=1 RT_TIMEOUT=300 $S/kernel_test_emu kernels/cuda-emu-own \
            --only attention-bf16 > $S/emu-own.out 2>&1; rc=$?
        cat $S/emu-own.out
        [ $rc -ne 0 ] && ! grep -q '^FAIL ' $S/emu-own.out &&
            fail cuda-emu-own "kernel_test_emu (ATTN=own) exited with status $rc"
        cudnn_refusals
        # the same f32 tolerance as the GPU's comparison below (summation orders and FMA
        # contraction differ from the CPU kernels')
        if [ $ok1 = 1 ] && build/tools/stcompare -q --atol 0 --rtol 1e-5 --atol-max 1e-5 \
                $S/emu-1.safetensors $S/cpu-t1.safetensors > $S/emu-vs-cpu.out 2>&1; then
            pass cuda-emu-vs-cpu
        else
            head -40 $S/emu-vs-cpu.out
            fail cuda-emu-vs-cpu "emulated CUDA and CPU kernel outputs differ beyond f32 tolerance"
        fi
    fi
fi

# -- CUDA: build whenever the backend is built; run only on a GPU -------------------------------
if ! make -s --no-print-directory echo 2>/dev/null | grep -q 'cuda backend enabled'; then
    skip cuda-build "CUDA backend not built here (needs nvcc, cuBLAS, NCCL and cuDNN's headers)"
    skip cuda-run "no CUDA backend"
elif ! $MK build/librt_cuda.a kernel-test-cuda > $S/build-cuda.log 2>&1; then
    sed 's/^/  /' $S/build-cuda.log | tail -20
    fail cuda-build "kernels_cuda.cu or kernel_test_cuda does not compile and link"
    skip cuda-run "the build failed"
else
    pass cuda-build
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
        skip cuda-run "no GPU (nvidia-smi -L lists none)"
    else
        ok=1
        for k in 1 2; do
            RT_TIMEOUT=120 $S/kernel_test_cuda kernels/cuda --dump $S/cuda-$k.safetensors \
                --dump-bf16 $S/cuda-$k-bf16.safetensors > $S/cuda-$k.out 2>&1
            rc=$?
            [ $k = 1 ] && cat $S/cuda-$k.out
            if [ $rc -ne 0 ]; then
                ok=0
                grep -q '^FAIL ' $S/cuda-$k.out ||
                    fail cuda-run "kernel_test_cuda exited with status $rc"
                break
            fi
        done
        if [ $ok = 1 ]; then
            # every CUDA kernel here gives each element to one thread (attention: one block
            # per tile, each element summed by one thread in order; RMSNorm's row sums: a warp
            # whose lanes are added in a fixed butterfly): run to run identical
            if cmp -s $S/cuda-1.safetensors $S/cuda-2.safetensors &&
               cmp -s $S/cuda-1-bf16.safetensors $S/cuda-2-bf16.safetensors; then
                pass cuda-deterministic
            else fail cuda-deterministic "two runs of the CUDA kernels differ"; fi
            # CUDA against the CPU results, f32: FMA contraction, tile shapes and summation
            # orders differ; each is within ~2.5e-6 of its tensor's scale from the reference,
            # so 1e-5 relative (to the value and to the scale) is ample. The bf16 outputs are
            # checked against the reference on each backend; the two may round an element to
            # neighbouring bf16 values (and the attention backward reads its own rounded
            # forward), so they are not compared with each other here.
            if build/tools/stcompare -q --atol 0 --rtol 1e-5 --atol-max 1e-5 \
                    $S/cuda-1.safetensors $S/cpu-t1.safetensors > $S/cuda-vs-cpu.out 2>&1; then
                pass cuda-vs-cpu
            else
                head -40 $S/cuda-vs-cpu.out
                fail cuda-vs-cpu "CUDA and CPU kernel outputs differ beyond f32 tolerance"
            fi
            # bf16 attention on the library's own kernels (the runs above: cuDNN's where it
            # loads)
            ATTN=own RT_TIMEOUT=120 $S/kernel_test_cuda kernels/cuda-own --only attention-bf16 \
                > $S/cuda-own.out 2>&1; rc=$?
            cat $S/cuda-own.out
            [ $rc -ne 0 ] && ! grep -q '^FAIL ' $S/cuda-own.out &&
                fail cuda-own "kernel_test_cuda (ATTN=own) exited with status $rc"
        else
            skip cuda-deterministic "the CUDA run failed"
            skip cuda-vs-cpu "the CUDA run failed"
        fi
    fi
fi
finish
