#!/bin/bash
# tests/moe/suite.sh: mixture of experts end to end (issue 7). On the CPU backend under mpirun,
# from one --init and one global batch (8 sequences of 64 in micro-batches of 2), every layout
# of the matrix -- EP in {1,2,4} x ETP in {1,2} combined with TP (SP on), DP, PP (1F1B and
# interleaved) and the distributed optimizer, world <= 8, including seed 001's MoE folding
# TP 4 x PP 2 with ETP 1 x EP 4 -- trains models/tiny_moe.lua 6 steps with the aux loss on;
# losses, aux losses, gradient norms and --save'd weights must match the single-rank program
# and the double-precision reference (build/ref/gpt2_ref). Then the routing edge cases against
# the reference on several layouts: ties (all router weights 0), experts that receive no
# tokens, every token to one expert, top-1, pre-softmax, expert biases, a capacity factor that
# drops tokens (also with every token's first choice on one expert); the expert part of the
# report and its numbers (tests/moe/inspect_test.lua); the CUDA programs compile and link.
# Tolerances and their reasons: tests/moe/README.md. Scratch: build/test/moe/.
cd "$(dirname "$0")/../.." || exit 2
# scratch (MOE_SCRATCH: elsewhere, e.g. to develop beside a running make test)
S=${MOE_SCRATCH:-build/test/moe}
rm -rf "$S"
mkdir -p "$S/run"
MPIRUN="mpirun --oversubscribe"
[ "$(id -u)" = 0 ] && MPIRUN="mpirun --allow-run-as-root --oversubscribe"
STEPS=6
WARMUP=2
GBS=8                   # sequences per step; micro-batches of MBS=2, so NMB*DP = 4
MBS=2
# layout vs the single-rank program, and single-rank program vs the reference (README.md)
LOSS_RTOL=1e-5          # loss, aux_loss, relative, every step
NORM_RTOL=1e-5          # gradient norm before clipping, relative, every step
WCMP="--atol 1e-6 --rtol 1e-5 --outliers 1e-3 --hard 1e-4"
FAILED=0

pass() { echo "PASS moe/$1"; }
fail() { echo "FAIL moe/$1: $2"; FAILED=1; }
skip() { echo "SKIP moe/$1: $2"; }

# -- Prerequisites ------------------------------------------------------------------------------

if ! make -s --no-print-directory build/gen build/librt_cpu.a ref > "$S/make.log" 2>&1; then
    fail setup "make build/gen build/librt_cpu.a ref failed: $(tail -n 1 "$S/make.log")"
    exit 1
fi
if ! command -v lua5.4 > /dev/null; then
    fail setup "lua5.4 not found (make deps)"
    exit 1
fi
if ! ${CC:-gcc} -std=c11 -O2 -Wall -Wextra -Werror -Itests/ref -o "$S/stcmp" \
        tests/parallel/stcmp.c build/ref/libref.a -lm > "$S/stcmp.log" 2>&1; then
    fail setup "cannot build tests/parallel/stcmp.c: $(head -n 1 "$S/stcmp.log")"
    exit 1
fi
REF=build/ref/gpt2_ref
EDIT="lua5.4 tests/moe/stedit.lua"
SHAPE="--layers 4 --hidden 64 --heads 4 --seq 64 --vocab 256"
C=64
LAYERS=4

# The reference's flags for each model (tests/ref/README.md "Command line").
declare -A REFFLAGS=(
    [tiny_moe]="--experts 8 --top-k 2 --expert-ffn 128 --aux-coeff 0.01"
    [moe_bias]="--experts 8 --top-k 2 --expert-ffn 128 --aux-coeff 0.01 --expert-bias"
    [moe_top1]="--experts 8 --top-k 1 --expert-ffn 128 --aux-coeff 0.01"
    [moe_pre]="--experts 8 --top-k 2 --expert-ffn 128 --aux-coeff 0.01 --pre-softmax"
    [moe_cap]="--experts 8 --top-k 2 --expert-ffn 128 --aux-coeff 0.01 --capacity 1.0"
)
model_arg() { [ "$1" = tiny_moe ] && echo tiny_moe || echo "tests/models/$1.lua"; }

# Inits: 'base' (random, seed 7), 'bias' (the same with expert biases), and the edge cases
# made from 'base' (stedit.lua):
#   ties  every router weight 0: every logit ties, so every token picks experts 0..k-1
#   idle  ln_2.bias[0] = 20 (channel 0 of the router input is in [12, 28] for every token:
#         LayerNorm bounds a normalised channel by sqrt(C-1) < 8) and router rows 6 and 7
#         get -1 in channel 0: logits in [-28, -12], far below the others (|z| < 2), so experts
#         6 and 7 never receive a token -- nor EP rank 3 of EP 4, which holds only them
#   one   ln_2.bias[0] = 20, router row 0 at +0.25 in channel 0 and the other rows at 0 there:
#         expert 0's logit is >= 3, the others' |z| < 1: expert 0 is every token's first
#         choice (not saturated: with +1 the softmax rounds to 1 in f32, and the router's
#         gradients become f32 noise, which Adam turns into whole steps)
edits_one=""
edits_idle=""
for i in $(seq 0 $((LAYERS - 1))); do
    edits_one="$edits_one set h.$i.ln_2.bias 0 20 set h.$i.mlp.router.weight 0 0.25"
    for e in 1 2 3 4 5 6 7; do edits_one="$edits_one set h.$i.mlp.router.weight $((e * C)) 0"; done
    edits_idle="$edits_idle set h.$i.ln_2.bias 0 20 set h.$i.mlp.router.weight $((6 * C)) -1"
    edits_idle="$edits_idle set h.$i.mlp.router.weight $((7 * C)) -1"
done
# shellcheck disable=SC2086 # flag lists are words
if ! { $REF $SHAPE ${REFFLAGS[tiny_moe]} --random-init 7 --save-init "$S/base.init.safetensors" &&
       $REF $SHAPE ${REFFLAGS[moe_bias]} --random-init 7 --save-init "$S/bias.init.safetensors" &&
       build/ref/make_tokens --vocab 256 --tokens 20000 --seed 3 "$S/tokens.bin" &&
       $EDIT edit "$S/base.init.safetensors" "$S/ties.init.safetensors" \
           fill 'h%.%d+%.mlp%.router%.weight' 0 &&
       $EDIT edit "$S/base.init.safetensors" "$S/idle.init.safetensors" $edits_idle &&
       $EDIT edit "$S/base.init.safetensors" "$S/one.init.safetensors" $edits_one
     } > "$S/setup.log" 2>&1; then
    fail setup "cannot make the inits or the token file: $(tail -n 1 "$S/setup.log")"
    exit 1
fi

# -- Layouts -------------------------------------------------------------------------------------

# A layout: "tp pp dp ep etp vp sp distopt"; NMB = GBS/(MBS*DP). SP is on whenever TP > 1
# (Megatron requires it for MoE with TP > 1).
lname() {   # layout -> short name: tp4-pp2-ep4-etp1-sp
    local n="tp$1"
    [ "$2" != 1 ] && n="$n-pp$2"
    [ "$3" != 1 ] && n="$n-dp$3"
    n="$n-ep$4-etp$5"
    [ "$6" != 1 ] && n="$n-vp$6"
    [ "$7" = 1 ] && n="$n-sp"
    [ "$8" = 1 ] && n="$n-distopt"
    echo "$n"
}
gen_args() {   # model layout -> build/gen arguments
    local m=$1
    shift
    local a
    a="$(model_arg "$m") --tp $1 --pp $2 --dp $3 --ep $4 --etp $5 --vp $6"
    a="$a --mbs $MBS --nmb $((GBS / (MBS * $3)))"
    [ "$7" = 1 ] && a="$a --sp"
    [ "$8" = 1 ] && a="$a --dist-opt"
    echo "$a"
}

# The matrix (tiny_moe from the base init). EP x ETP: 1x1 (single, tp2), 1x2 (tp1 over dp,
# tp2 = ETP), 2x1 (over dp, over tp, over pp, interleaved, edp 2 + distopt), 2x2, 4x1 (over
# dp, seed 001 folding with and without distopt), 4x2.
MATRIX="
1 1 1 1 1 1 0 0
1 1 2 2 1 1 0 0
1 1 2 1 2 1 0 0
1 1 4 4 1 1 0 0
1 1 4 2 1 1 0 1
1 1 4 2 2 1 0 1
2 1 1 1 2 1 1 0
2 1 1 1 1 1 1 0
2 1 1 2 1 1 1 0
2 1 2 2 2 1 1 0
2 1 2 4 1 1 1 1
2 1 2 2 1 1 1 1
1 2 2 2 1 1 0 0
1 2 2 2 1 2 0 0
1 4 2 2 1 1 0 1
2 2 1 2 1 1 1 0
2 2 2 2 2 1 1 1
4 2 1 4 1 1 1 0
4 2 1 4 1 1 1 1
4 1 2 4 2 1 1 0
2 1 4 4 2 1 1 1
"
SINGLE="1 1 1 1 1 1 0 0"
SEED001="4 2 1 4 1 1 1 0"
# Edge cases: "case model init layout": each against the reference on one rank and on layouts
# where the case stresses the communication (idle EP ranks, every row to one rank, SP shards
# counting capacity across each other).
EDGES="
ties tiny_moe ties $SINGLE
ties tiny_moe ties $SEED001
ties tiny_moe ties 2 1 2 2 2 1 1 0
ties tiny_moe ties 2 1 4 4 2 1 1 1
idle tiny_moe idle $SINGLE
idle tiny_moe idle $SEED001
idle tiny_moe idle 1 1 4 4 1 1 0 0
idle tiny_moe idle 4 1 2 4 2 1 1 0
top1 moe_top1 base $SINGLE
top1 moe_top1 base 2 1 2 2 2 1 1 0
top1 moe_top1 base $SEED001
one moe_top1 one $SINGLE
one moe_top1 one 2 1 2 2 2 1 1 0
one moe_top1 one $SEED001
pre moe_pre base $SINGLE
pre moe_pre base 2 1 2 2 2 1 1 0
pre moe_pre base $SEED001
bias moe_bias bias $SINGLE
bias moe_bias bias 2 1 2 2 1 1 1 1
bias moe_bias bias $SEED001
cap moe_cap base $SINGLE
cap moe_cap base 2 1 2 2 2 1 1 0
cap moe_cap base $SEED001
cap-one moe_cap one $SINGLE
cap-one moe_cap one 2 1 2 2 2 1 1 0
cap-one moe_cap one $SEED001
"

# Generate and build (CPU) each (model, layout) once: $S/out/<model>-<layout>.
declare -A DIR WORLD
build_one() {   # model layout...
    local m=$1
    shift
    local key
    key="$m-$(lname "$@")"
    [ -n "${DIR[$key]}" ] && return 0
    [ -f "$S/$key.broken" ] && return 1
    local out=$S/out/$key
    # shellcheck disable=SC2046 # the generator arguments are words without spaces
    if build/gen $(gen_args "$m" "$@") --out "$out" > "$S/$key.gen.log" 2>&1 &&
       make -s --no-print-directory -j2 GEN_DIR="$out" GEN_OBJ="$S/obj/$key" "$out/train" \
            > "$S/$key.build.log" 2>&1; then
        DIR[$key]=$out
        WORLD[$key]=$(($1 * $2 * $3))
        return 0
    fi
    touch "$S/$key.broken"
    return 1
}
build_why() {   # key -> first error line of its generation / build
    cat "$S/$1.gen.log" "$S/$1.build.log" 2> /dev/null | grep -m1 -E 'error|Error' | cut -c1-160
}

# run_one KEY INIT TAG [FLAG...]: train KEY from $S/INIT.init.safetensors (plus FLAGs);
# $S/run/TAG.{jsonl,safetensors}
run_one() {
    local key=$1 init=$2 tag=$3 w=${WORLD[$1]}
    shift 3
    local args=(--quiet --init "$S/$init.init.safetensors" --data "$S/tokens.bin"
                --steps $STEPS --warmup $WARMUP --log "$S/run/$tag.jsonl"
                --save "$S/run/$tag.safetensors" "$@")
    if [ "$w" = 1 ]; then
        timeout 300 "${DIR[$key]}/train" "${args[@]}" > "$S/run/$tag.log" 2>&1 < /dev/null
    else
        timeout 300 $MPIRUN -np "$w" "${DIR[$key]}/train" "${args[@]}" \
            > "$S/run/$tag.log" 2>&1 < /dev/null
    fi
}

# ref_run MODEL INIT: the reference's run, $S/run/ref.MODEL.INIT.{jsonl,safetensors}
ref_run() {
    local tag=ref.$1.$2
    [ -f "$S/run/$tag.jsonl" ] && return 0
    # shellcheck disable=SC2086
    $REF $SHAPE ${REFFLAGS[$1]} --init "$S/$2.init.safetensors" --data "$S/tokens.bin" \
        --steps $STEPS --warmup $WARMUP --mbs $MBS --nmb $((GBS / MBS)) \
        --log "$S/run/$tag.jsonl" --save "$S/run/$tag.safetensors" > "$S/run/$tag.log" 2>&1
}

# cmp_logs A.jsonl B.jsonl: the same steps; loss and aux_loss within LOSS_RTOL and grad_norm
# within NORM_RTOL of B's, relative. Prints the largest differences; exit 1 on a mismatch.
cmp_logs() {
    awk -v lt="$LOSS_RTOL" -v nt="$NORM_RTOL" '
        function field(line, key,   m) {
            if (match(line, "\"" key "\":[-+0-9.eE]+")) {
                m = substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
                return m + 0
            }
            return "none"
        }
        function rel(a, b) {
            if (a == "none" || b == "none") return 1e30
            d = a - b; if (d < 0) d = -d; if (b < 0) b = -b
            return b > 0 ? d / b : d
        }
        FNR == 1 { f++ }
        f == 1 { na++; L[na] = field($0, "loss"); A[na] = field($0, "aux_loss")
                 N[na] = field($0, "grad_norm"); next }
        f == 2 { nb++; if (nb > na) next
                 l = rel(L[nb], field($0, "loss")); a = rel(A[nb], field($0, "aux_loss"))
                 n = rel(N[nb], field($0, "grad_norm"))
                 if (l > ml) ml = l
                 if (a > ma) ma = a
                 if (n > mn) mn = n
                 if (l > lt || a > lt || n > nt) { bad++; if (!first) first = nb } }
        END {
            printf "max rel diff loss %.2g, aux %.2g, grad_norm %.2g over %d steps", ml, ma, mn, nb
            if (na != nb || na == 0) { printf "; %d steps vs %d", na, nb; exit 1 }
            if (bad) { printf "; first mismatch at step %d", first; exit 1 }
        }' "$1" "$2"
}

# check TEST TAG OTHER...: PASS when run TAG matches every run OTHER (logs and weights)
check() {
    local t=$1 tag=$2 o why
    shift 2
    for o in "$@"; do
        if ! why=$(cmp_logs "$S/run/$tag.jsonl" "$S/run/$o.jsonl"); then
            fail "$t" "vs $o: $why"
            return 1
        fi
        echo "$t vs $o: $why" >> "$S/summary.txt"
        if ! why=$("$S/stcmp" "$S/run/$tag.safetensors" "$S/run/$o.safetensors" $WCMP 2>&1); then
            fail "$t" "weights vs $o: $(echo "$why" | tail -n 1)"
            return 1
        fi
        echo "$t vs $o: $(echo "$why" | tail -n 1)" >> "$S/summary.txt"
    done
    pass "$t"
}

# -- The matrix: every layout trains like one rank and like the reference ------------------------

ref_run tiny_moe base ||
    fail ref "the reference run failed: $(tail -n 1 "$S/run/ref.tiny_moe.base.log")"
single=tiny_moe-$(lname $SINGLE)
while read -r -a L; do
    [ ${#L[@]} = 0 ] && continue
    name=$(lname "${L[@]}")
    key=tiny_moe-$name
    if ! build_one tiny_moe "${L[@]}"; then
        fail "$name" "generate/build failed: $(build_why "$key")"
        continue
    fi
    if ! run_one "$key" base "$key.base"; then
        fail "$name" "training failed: $(grep -m1 -E 'error|rank|Error' "$S/run/$key.base.log" |
                                         cut -c1-160)"
        continue
    fi
    if [ "$key" = "$single" ]; then
        check single-rank-vs-reference "$key.base" ref.tiny_moe.base
    else
        check "$name" "$key.base" "$single.base" ref.tiny_moe.base
    fi
done <<< "$MATRIX"

# Control: the comparisons can fail. A run that differs only slightly (learning rate 6e-4 ->
# 6.06e-4) must fail both the log and the weight comparisons with the single-rank run.
if [ -n "${DIR[$single]}" ] && run_one "$single" base control --lr 6.06e-4 &&
   [ -f "$S/run/$single.base.jsonl" ]; then
    if cmp_logs "$S/run/control.jsonl" "$S/run/$single.base.jsonl" > /dev/null; then
        fail control-loss "a 1% learning-rate change went unnoticed by the log comparison"
    else
        pass control-loss
    fi
    if "$S/stcmp" "$S/run/control.safetensors" "$S/run/$single.base.safetensors" $WCMP \
            > /dev/null; then
        fail control-weights "a 1% learning-rate change went unnoticed by the weight comparison"
    else
        pass control-weights
    fi
else
    fail control "the control run failed: $(tail -n 1 "$S/run/control.log")"
fi

# -- Checkpoints: layout-free whole-model files, bit-exact resume ---------------------------------

# Layouts load the single-rank run's trained weights (experts, router, biases no longer at
# their init) and --save them back bit for bit (--steps 0): every expert piece is read from
# and written to its place, once (save owners: expt-dp rank 0, expt-tp slices).
trained=$S/run/$single.base.safetensors
rt_bad="" rt_n=0
for l in "$SEED001" "4 2 1 4 1 1 1 1" "4 1 2 4 2 1 1 0" "2 1 4 4 2 1 1 1" "1 1 2 1 2 1 0 0" \
         "1 2 2 2 1 2 0 0" "2 1 1 1 1 1 1 0"; do
    # shellcheck disable=SC2086
    key=tiny_moe-$(lname $l)
    [ -n "${DIR[$key]}" ] && [ -f "$trained" ] || continue
    rt_n=$((rt_n + 1))
    if ! run_one "$key" base "$key.rt" --init "$trained" --steps 0 ||
       ! "$S/stcmp" "$S/run/$key.rt.safetensors" "$trained" --exact > "$S/$key.rt.cmp" 2>&1; then
        rt_bad="$rt_bad $key"
    fi
done
if [ $rt_n -lt 7 ]; then fail checkpoint-roundtrip "only $rt_n layouts could be checked"
elif [ -n "$rt_bad" ]; then fail checkpoint-roundtrip "load + save is not the identity for:$rt_bad"
else pass checkpoint-roundtrip; fi

# --resume continues bit-exactly: TP 2 x DP 2 with EP 2 and DIST_OPT (the experts' AdamW
# moments sharded over expt-dp = 2, the dense ones over dp) stops after step 4 (its last
# checkpoint: step 3) and resumes to step 6: the log lines (timings aside) and the weights
# are the uninterrupted run's.
resume_check() {
    local key=$1 a=(--decay-steps $STEPS --ckpt-every 3)
    rm -rf "$S/ck-full" "$S/ck-part"
    run_one "$key" base "$key.full" "${a[@]}" --ckpt-dir "$S/ck-full" &&
    run_one "$key" base "$key.part" "${a[@]}" --ckpt-dir "$S/ck-part" --steps 4 &&
    run_one "$key" base "$key.part" "${a[@]}" --ckpt-dir "$S/ck-part" --resume || return 1
    grep -q "resumed from $S/ck-part/step_00000003" "$S/run/$key.part.log" ||
        { echo "did not resume from step 3"; return 1; }
    diff <(sed 's/,"ms":.*//' "$S/run/$key.part.jsonl") \
         <(sed 's/,"ms":.*//' "$S/run/$key.full.jsonl") &&
    cmp "$S/run/$key.part.safetensors" "$S/run/$key.full.safetensors"
}
key=tiny_moe-$(lname 2 1 2 2 1 1 1 1)
if [ -z "${DIR[$key]}" ]; then fail resume "$key was not built"
elif resume_check "$key" > "$S/resume.log" 2>&1; then pass resume
else fail resume "resuming $key is not bit-exact: $(head -n 1 "$S/resume.log")"; fi

# -- Routing edge cases against the reference ---------------------------------------------------

declare -A RUNS     # case -> the tags of its runs

while read -r case m init rest; do
    [ -z "$case" ] && continue
    # shellcheck disable=SC2086 # the layout is words
    set -- $rest
    name=$(lname "$@")
    key=$m-$name
    if ! ref_run "$m" "$init"; then
        fail "$case-$name" "the reference failed: $(tail -n 1 "$S/run/ref.$m.$init.log")"
        continue
    fi
    if ! build_one "$m" "$@"; then
        fail "$case-$name" "generate/build failed: $(build_why "$key")"
        continue
    fi
    tag=$key.$init
    if [ ! -f "$S/run/$tag.jsonl" ] && ! run_one "$key" "$init" "$tag"; then
        fail "$case-$name" "training failed: $(grep -m1 -E 'error|rank|Error' \
                                               "$S/run/$tag.log" | cut -c1-160)"
        continue
    fi
    check "$case-$name" "$tag" "ref.$m.$init"
    RUNS[$case]="${RUNS[$case]} $tag"
done <<< "$EDGES"

# step1 FILE KEY: the value of KEY in the first line of a JSONL log
step1() { sed -n "1s/.*\"$2\":\([-+0-9.eE]*\).*/\1/p" "$1"; }
# untouched RUN PATTERN: the tensors matching PATTERN in RUN's saved weights are the init's
# times prod_t (1 - lr_t * wd) exactly (to f32 rounding, 1e-6): no gradient ever reached them,
# only AdamW's decoupled weight decay (wd 0.1; Adam's step is 0/(0 + eps) = 0)
untouched() {
    local run=$1 pattern=$2 init want got
    init=${run##*.}
    want=$(awk '{ if (match($0, /"lr":[-+0-9.eE]+/))
                      p *= 1 - 0.1 * substr($0, RSTART + 5, RLENGTH - 5) }
                BEGIN { p = 1 } END { printf "%.10g", p }' "$S/run/$run.jsonl")
    got=$($EDIT ratio "$S/run/$run.safetensors" "$S/$init.init.safetensors" "$pattern") || return 1
    echo "$got" | awk -v w="$want" '{ d1 = $2 - w; d2 = $3 - w; if (d1 < 0) d1 = -d1
        if (d2 < 0) d2 = -d2
        printf "%d elements, final/init in [%.9g, %.9g], decay %.9g", $1, $2, $3, w
        exit !(d1 <= 1e-6 && d2 <= 1e-6) }'
}

# Ties: with every router weight 0 all logits tie, every token takes experts 0 and 1, and the
# scores are uniform, so each layer's aux loss is exactly coeff * E * sum_e (1/E) * f_e = coeff:
# the first step logs aux_loss = 4 layers * 0.01 on every layout.
bad=""
for tag in ${RUNS[ties]}; do
    a=$(step1 "$S/run/$tag.jsonl" aux_loss)
    awk -v a="$a" 'BEGIN { d = a - 0.04; if (d < 0) d = -d; exit !(a != "" && d <= 4e-8) }' ||
        bad="$bad $tag (aux $a)"
done
if [ -z "${RUNS[ties]}" ]; then fail ties-uniform-aux "no ties run"
elif [ -n "$bad" ]; then fail ties-uniform-aux "step 1 aux_loss is not 0.04:$bad"
else pass ties-uniform-aux; fi

# Idle experts: experts 6 and 7 (and EP 4's rank 3) never see a token, so their weights only
# decay, on every layout; a control: expert 0 does learn.
for case in idle one; do
    if [ $case = idle ]; then pattern='h%.%d+%.mlp%.experts%.[67]%..*'
    else pattern='h%.%d+%.mlp%.experts%.[1-7]%..*'; fi
    bad=""
    for tag in ${RUNS[$case]}; do
        why=$(untouched "$tag" "$pattern") || bad="$bad $tag: $why;"
        echo "$case-untouched $tag: $why" >> "$S/summary.txt"
    done
    # shellcheck disable=SC2086 # the tags are words
    set -- ${RUNS[$case]}
    first=$1
    if [ -z "${RUNS[$case]}" ]; then fail "$case-untouched" "no $case run"
    elif [ -n "$bad" ]; then fail "$case-untouched" "experts that receive no token changed:$bad"
    elif untouched "$first" 'h%.%d+%.mlp%.experts%.0%..*' > /dev/null; then
        fail "$case-untouched" "control: expert 0 did not learn either ($first)"
    else pass "$case-untouched"; fi
done

# Capacity: the capacity factor must matter, or the cap cases test nothing: with it the
# reference's first step differs from the same run without it (tiny_moe) by more than ten
# times the tolerance, for the random init (observed 1.9e-4) and for the one where expert 0
# is every first choice.
ref_run tiny_moe one
for init in base one; do
    a=$(step1 "$S/run/ref.moe_cap.$init.jsonl" loss)
    b=$(step1 "$S/run/ref.tiny_moe.$init.jsonl" loss)
    if awk -v a="$a" -v b="$b" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d
                                        exit !(a != "" && b != "" && d > 1e-4) }'; then
        pass "cap-drops-$init"
    else
        fail "cap-drops-$init" "capacity 1 does not change the first step (loss $a vs $b)"
    fi
done

# -- The report: experts, groups, traffic (make inspect) -----------------------------------------

# The numbers, worked out by hand (tests/moe/inspect_test.lua; its lines become moe/<test>).
build/gen --lua tests/moe/inspect_test.lua > "$S/inspect_test.out" 2> "$S/inspect_test.err"
rc=$?
sed -n 's#^\(PASS\|FAIL\|SKIP\) lua/moe/#\1 moe/inspect-#p' "$S/inspect_test.out"
grep -q '^FAIL ' "$S/inspect_test.out" && FAILED=1
if [ $rc != 0 ] && ! grep -q '^FAIL ' "$S/inspect_test.out"; then
    fail inspect-test "tests/moe/inspect_test.lua died: $(head -n 1 "$S/inspect_test.err")"
fi
# MoE with TP > 1 needs SP (Megatron refuses it otherwise): the generator says so, writes nothing
if build/gen tiny_moe --tp 2 --out "$S/out/no-sp" > "$S/no-sp.log" 2>&1; then
    fail gen-tp-needs-sp "tiny_moe --tp 2 without --sp was generated"
elif grep -q '^gen: error: mixture of experts with TP (2) > 1 needs sequence parallelism' \
        "$S/no-sp.log" && [ ! -e "$S/out/no-sp" ]; then
    pass gen-tp-needs-sp
else
    fail gen-tp-needs-sp "unexpected message: $(grep -m1 error "$S/no-sp.log")"
fi
# `make inspect ... RANK=r` shows the section for seed 001's rank 5
if make -s --no-print-directory inspect MODEL=tiny_moe TP=4 PP=2 SP=1 ETP=1 EP=4 MBS=2 NMB=2 \
        RANK=5 > "$S/inspect.txt" 2>&1 &&
   grep -q '^  holds        experts 2-3 (global ids)' "$S/inspect.txt" &&
   grep -q '^    fwd   all-to-all  ep ' "$S/inspect.txt"; then
    pass make-inspect
else
    fail make-inspect "make inspect RANK=5 lacks the experts section: $(head -n 1 "$S/inspect.txt")"
fi

# -- CUDA: the programs compile and link; on a GPU they train like the reference -----------------

CUDA_BUILDS="
tiny_moe $SINGLE
tiny_moe $SEED001
tiny_moe 2 1 4 4 2 1 1 1
moe_bias 2 1 2 2 1 1 1 1
moe_cap 2 1 2 2 2 1 1 0
moe_pre 2 1 2 2 2 1 1 0
"
if make -s --no-print-directory echo 2> /dev/null | grep -q 'cuda backend enabled'; then
    cuda_ok=""
    while read -r m rest; do
        [ -z "$m" ] && continue
        # shellcheck disable=SC2086
        set -- $rest
        key=$m-$(lname "$@")
        if ! build_one "$m" "$@"; then
            fail "cuda-build-$key" "generate failed: $(build_why "$key")"
        elif make -s --no-print-directory GEN_DIR="${DIR[$key]}" GEN_OBJ="$S/obj/$key" \
                "${DIR[$key]}/train_cuda" > "$S/$key.cuda.log" 2>&1; then
            pass "cuda-build-$key"
            cuda_ok="$cuda_ok $key"
        else
            fail "cuda-build-$key" "$(grep -m1 -E 'error|Error' "$S/$key.cuda.log" | cut -c1-160)"
        fi
    done <<< "$CUDA_BUILDS"
    if command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then
        # every rank on the GPU(s) (ranks may share one), against the reference with the CPU
        # tolerances: the f32 kernels differ from the CPU's only in summation order
        for key in $cuda_ok; do
            m=${key%%-tp*}
            case $m in moe_bias) init=bias ;; *) init=base ;; esac
            tag=$key.$init.gpu
            if ! ref_run "$m" "$init"; then
                fail "cuda-run-$key" "the reference failed"
                continue
            fi
            if ! timeout 300 $MPIRUN -np "${WORLD[$key]}" "${DIR[$key]}/train_cuda" --quiet \
                    --init "$S/$init.init.safetensors" --data "$S/tokens.bin" --steps $STEPS \
                    --warmup $WARMUP --log "$S/run/$tag.jsonl" \
                    --save "$S/run/$tag.safetensors" > "$S/run/$tag.log" 2>&1 < /dev/null; then
                fail "cuda-run-$key" "$(grep -m1 -E 'error|rank' "$S/run/$tag.log" | cut -c1-160)"
                continue
            fi
            check "cuda-run-$key" "$tag" "ref.$m.$init"
        done
    else
        skip cuda-run "no GPU (nvidia-smi lists none): built and linked only"
    fi
else
    skip cuda-build "the CUDA backend is not built (make echo)"
fi

exit $FAILED
