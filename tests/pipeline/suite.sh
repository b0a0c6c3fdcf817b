#!/bin/sh
# tests/pipeline/suite.sh: pipeline parallelism end to end (issue 6), on the CPU under mpirun.
#  * every layout below trains models/tiny.lua for $STEPS steps from the same --init file on the
#    same global batch as the single-rank program; losses and gradient norms of every step and
#    the --save'd weights must match the single rank's within the tolerances below;
#  * tied embeddings: the last stage's wte equals the first stage's bit for bit (per-rank resume
#    checkpoint) and --save writes the first stage's; the norm counts it once (grad_norm matches);
#  * the single-rank baseline itself against the double-precision reference (the oracle);
#  * a deliberately broken schedule makes build/gen write nothing and print the counterexample;
#  * the activation bytes make inspect reports equal what the program allocates;
#  * make MODEL=gpt3_175b TP=8 PP=8 generates and compiles, CPU and CUDA (SKIP without nvcc).
# Protocol: docs/DESIGN.md section 3; scratch in build/test/pipeline/ (or $PIPELINE_SCRATCH, for
# two runs at once). Run: tests/run.sh pipeline

cd "$(dirname "$0")/../.." || exit 2
S=${PIPELINE_SCRATCH:-build/test/pipeline}
GEN=build/gen
STEPS=6
status=0

# Tolerances. Everything is f32 and the layouts differ only in summation order (TP splits
# GEMM reductions, DP and the tied-embedding all-reduce add partial gradients), so results agree
# to rounding; AdamW's first steps amplify rounding in tiny gradients to ~1e-5 in the weights.
# Observed maxima (2026-11, all layouts below; per layout in $S/diffs.txt): loss 7e-7, norm
# 3e-7, weights 8.3e-6 (tp2 pp4 vp2), reference 1e-7. A schedule bug (wrong micro-batch, lost
# or doubled gradient, wrong scale) moves losses by >1e-4 and weights by ~lr = 6e-4.
LOSS_RTOL=1e-5      # per-step loss, relative
NORM_RTOL=1e-5      # per-step gradient norm, relative
W_ATOL=5e-5         # saved weights: |got - want| <= W_ATOL + W_RTOL*|want|
W_RTOL=1e-4
REF_RTOL=1e-5       # single-rank f32 program against the f64 reference: per-step loss

pass() { echo "PASS pipeline/$1"; }
fail() { echo "FAIL pipeline/$1: $2"; status=1; }
skip() { echo "SKIP pipeline/$1: $2"; }

rm -rf "$S"
mkdir -p "$S"
if ! make -s all ref > "$S/make.txt" 2>&1; then
    sed 's/^/    /' "$S/make.txt" | tail -n 20
    fail build "make all ref failed"
    exit 1
fi

MPIRUN="mpirun --oversubscribe"
[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
have_mpi=1
command -v mpirun > /dev/null 2>&1 || have_mpi=0

# -- Data and initial weights -----------------------------------------------------------------

build/ref/make_tokens --vocab 256 --tokens 200000 --seed 11 "$S/tokens.bin" > /dev/null || exit 2
build/ref/gpt2_ref --layers 8 --hidden 64 --heads 4 --seq 64 --vocab 256 --random-init 5 \
    --save-init "$S/init.safetensors" > /dev/null || exit 2

# -- Helpers ------------------------------------------------------------------------------------

# field NAME FILE.jsonl: one value per line
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" "$2"; }

# close FILE_A FILE_B RTOL: same number of lines, every value within RTOL (relative); prints
# the worst relative difference, or the first offending line
close() {
    paste "$1" "$2" | awk -v tol="$3" '
        { n++; d = $1 - $2; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; r = s > 0 ? d / s : d
          if (NF != 2 || r > tol) { if (!bad) printf "step %d: %s vs %s", NR, $1, $2; bad = 1 }
          if (r > worst) worst = r }
        END { if (!bad) printf "%.2g", worst; exit bad || n == 0 }'
}

# build NAME GEN-ARGS...: generate into $S/NAME and compile its CPU program
build() {
    name=$1; shift
    if ! $GEN "$@" --out "$S/$name" > "$S/$name.gen.txt" 2>&1; then
        echo "gen $*: $(grep -m1 error "$S/$name.gen.txt")"
        return 1
    fi
    if ! make -s -j2 GEN_DIR="$S/$name" GEN_OBJ="$S/obj/$name" "$S/$name/train" \
            < /dev/null > "$S/$name.make.txt" 2>&1; then
        echo "compiling $S/$name failed: $(grep -m1 -i error "$S/$name.make.txt")"
        return 1
    fi
}

world_of() { sed -n 's/^{"model": "[^"]*", "world": \([0-9]*\),.*/\1/p' "$S/$1/topology.json"; }

# train NAME [EXTRA FLAGS]: $STEPS steps from the common init; log, weights under $S/NAME.*
train() {
    name=$1; shift
    w=$(world_of "$name")
    set -- "$S/$name/train" --init "$S/init.safetensors" --data "$S/tokens.bin" \
        --steps $STEPS --log "$S/$name.jsonl" --save "$S/$name.safetensors" --quiet \
        --timeout 120 "$@"
    if [ "$w" -gt 1 ]; then
        timeout 600 $MPIRUN -np "$w" "$@" < /dev/null > "$S/$name.run.txt" 2>&1
    else
        timeout 600 "$@" < /dev/null > "$S/$name.run.txt" 2>&1
    fi
}

# -- Layouts ------------------------------------------------------------------------------------
# name | global batch (MBS*NMB*DP) | gen arguments. NMB covers P, 2P and more (and fewer than P
# for 1F1B); every layout of tiny (8 layers) with world <= 8 that the issue names.
LAYOUTS="
pp2-nmb2|4|--pp 2 --nmb 2 --mbs 2
pp2-nmb4|4|--pp 2 --nmb 4
pp2-nmb8|8|--pp 2 --nmb 8
pp2-vp2-nmb2|4|--pp 2 --vp 2 --nmb 2 --mbs 2
pp2-vp2-nmb4|4|--pp 2 --vp 2 --nmb 4
pp2-vp2-nmb8|8|--pp 2 --vp 2 --nmb 8
pp4-nmb1|4|--pp 4 --nmb 1 --mbs 4
pp4-nmb2|4|--pp 4 --nmb 2 --mbs 2
pp4-nmb4|8|--pp 4 --nmb 4 --mbs 2
pp4-nmb8|8|--pp 4 --nmb 8
pp4-nmb16|16|--pp 4 --nmb 16
pp4-vp2-nmb4|8|--pp 4 --vp 2 --nmb 4 --mbs 2
pp4-vp2-nmb8|8|--pp 4 --vp 2 --nmb 8
pp4-vp2-nmb16|16|--pp 4 --vp 2 --nmb 16
tp2-pp2-dp2-nmb4|8|--tp 2 --pp 2 --dp 2 --nmb 4
tp2-pp2-vp2-nmb4-sp|8|--tp 2 --pp 2 --vp 2 --nmb 4 --mbs 2 --sp
pp2-dp2-vp2-nmb2-distopt|8|--pp 2 --dp 2 --vp 2 --nmb 2 --mbs 2 --dist-opt
tp2-pp4-nmb8-sp|8|--tp 2 --pp 4 --nmb 8 --sp
pp4-dp2-vp2-nmb4|8|--pp 4 --dp 2 --vp 2 --nmb 4
tp2-pp4-vp2-nmb4|4|--tp 2 --pp 4 --vp 2 --nmb 4
pp4-first1-last1-nmb8|8|--pp 4 --first-layers 1 --last-layers 1 --nmb 8
pp2-vp2-first6-nmb4|8|--pp 2 --vp 2 --first-layers 6 --nmb 4 --mbs 2
tp2-pp3-vp2-first2-last2-nmb6|6|--tp 2 --pp 3 --vp 2 --first-layers 2 --last-layers 2 --nmb 6
pp4-dp2-first3-last1-distopt|8|--pp 4 --dp 2 --first-layers 3 --last-layers 1 --nmb 4 --dist-opt
"
# layouts whose two wte copies are checked through their resume checkpoints
TIED="tp2-pp2-dp2-nmb4 pp4-vp2-nmb8 pp2-dp2-vp2-nmb2-distopt tp2-pp3-vp2-first2-last2-nmb6"

if [ $have_mpi = 0 ]; then
    skip layouts "mpirun not found (make deps)"
    LAYOUTS=""
fi

# Baselines: one single-rank program per global batch.
batches=$(echo "$LAYOUTS" | awk -F'|' 'NF == 3 { print $2 }' | sort -n | uniq)
for g in $batches; do
    if ! why=$(build "base$g" tiny --mbs 1 --nmb "$g"); then
        fail "baseline-$g" "$why"
        continue
    fi
    if ! train "base$g"; then
        fail "baseline-$g" "training failed: $(tail -n 1 "$S/base$g.run.txt")"
        continue
    fi
    field loss "$S/base$g.jsonl" > "$S/base$g.loss"
    field grad_norm "$S/base$g.jsonl" > "$S/base$g.norm"
done

# The baseline against the reference (same init, data, batch): anchors every comparison.
if [ -f "$S/base8.loss" ]; then
    if build/ref/gpt2_ref --layers 8 --hidden 64 --heads 4 --seq 64 --vocab 256 \
            --init "$S/init.safetensors" --data "$S/tokens.bin" --steps $STEPS --mbs 1 --nmb 8 \
            --log "$S/ref8.jsonl" > "$S/ref8.txt" 2>&1; then
        field loss "$S/ref8.jsonl" > "$S/ref8.loss"
        if d=$(close "$S/base8.loss" "$S/ref8.loss" $REF_RTOL); then
            pass baseline-vs-reference
        else
            fail baseline-vs-reference "single-rank loss vs gpt2_ref: $d (rtol $REF_RTOL)"
        fi
    else
        fail baseline-vs-reference "gpt2_ref failed: $(tail -n 1 "$S/ref8.txt")"
    fi
fi

# Every layout against its baseline.
echo "$LAYOUTS" | while IFS='|' read -r name g args; do
    [ -n "$name" ] || continue
    base=$S/base$g
    if [ ! -f "$base.loss" ]; then
        fail "$name" "no baseline for global batch $g"
        continue
    fi
    # shellcheck disable=SC2086 # the arguments are words
    if ! why=$(build "$name" tiny $args); then
        fail "$name" "$why"
        continue
    fi
    extra=""
    case " $TIED " in *" $name "*) extra="--ckpt-dir $S/$name.ckpt --ckpt-every $STEPS" ;; esac
    # shellcheck disable=SC2086
    if ! train "$name" $extra; then
        fail "$name" "training failed: $(grep -m1 -i 'error\|abort' "$S/$name.run.txt")"
        continue
    fi
    field loss "$S/$name.jsonl" > "$S/$name.loss"
    field grad_norm "$S/$name.jsonl" > "$S/$name.norm"
    if ! dl=$(close "$S/$name.loss" "$base.loss" $LOSS_RTOL); then
        fail "$name" "loss differs from the single rank: $dl (rtol $LOSS_RTOL)"
    elif ! dn=$(close "$S/$name.norm" "$base.norm" $NORM_RTOL); then
        fail "$name" "gradient norm differs from the single rank: $dn (rtol $NORM_RTOL)"
    elif ! dw=$($GEN --lua tests/pipeline/stcompare.lua "$S/$name.safetensors" \
                "$base.safetensors" $W_ATOL $W_RTOL > "$S/$name.cmp.txt" 2>&1); then
        sed 's/^/    /' "$S/$name.cmp.txt" | head -n 6
        fail "$name" "saved weights differ from the single rank: $(tail -n 1 "$S/$name.cmp.txt")"
    else
        echo "$name: loss $dl, norm $dn, weights $(tail -n 1 "$S/$name.cmp.txt" |
              sed 's/;.*//')" >> "$S/diffs.txt"
        pass "$name"
    fi
    case " $TIED " in
    *" $name "*)
        if out=$($GEN --lua tests/pipeline/tied.lua "$S/$name" \
                 "$S/$name.ckpt/$(printf 'step_%08d' $STEPS)" "$S/$name.safetensors" 2>&1); then
            pass "tied-wte/$name"
        else
            fail "tied-wte/$name" "$(echo "$out" | tail -n 1)"
        fi ;;
    esac
done > "$S/layouts.txt"
cat "$S/layouts.txt"
grep -q '^FAIL' "$S/layouts.txt" && status=1

# The tied copy is counted once in the gradient norm: with PP > 1 the norm of every step equals
# the single rank's (where wte exists once); counted twice it would grow by |grad wte|.
if [ -f "$S/tp2-pp2-dp2-nmb4.norm" ] && [ -f "$S/base8.norm" ]; then
    if d=$(close "$S/tp2-pp2-dp2-nmb4.norm" "$S/base8.norm" $NORM_RTOL); then
        pass tied-norm-counted-once
    else
        fail tied-norm-counted-once "tp2 pp2 dp2 grad_norm vs single rank: $d"
    fi
fi

# -- A broken schedule is refused ----------------------------------------------------------------

for how in swap missing; do
    out=$S/broken-$how
    PIPELINE_BREAK=$how $GEN --driver tests/pipeline/broken_driver.lua tiny --pp 4 --tp 2 \
        --nmb 8 --out "$out" > "$out.txt" 2>&1
    rc=$?
    case $how in
    swap) want="the schedule deadlocks:|stage 1 (rank 2) waits at step|stage 2 (rank 4) waits" ;;
    missing) want="stage 2 (rank 4) runs the backward of mb 7 (chunk 0) before its output" ;;
    esac
    missing_text=$(echo "$want" | tr '|' '\n' | while read -r w; do
        grep -qF "$w" "$out.txt" || echo "$w"; done)
    if [ $rc -ne 1 ]; then
        fail "refuses-broken-schedule/$how" "gen exited with $rc, want 1"
    elif [ -e "$out" ]; then
        fail "refuses-broken-schedule/$how" "gen wrote $out"
    elif ! grep -q 'failed verification' "$out.txt" || [ -n "$missing_text" ]; then
        fail "refuses-broken-schedule/$how" "counterexample lacks: $(echo "$missing_text" |
              head -n 1)"
    else
        pass "refuses-broken-schedule/$how"
    fi
done

# -- Regenerating leaves unchanged files alone (a warm make recompiles nothing) ----------------

d=$S/regen
if $GEN tiny --pp 2 --nmb 2 --out "$d" > "$d.txt" 2>&1; then
    touch -d 2000-01-01 "$d"/*
    touch -d 2001-01-01 "$d.stamp"
    echo "/* edited */" >> "$d/stage1.c"
    $GEN tiny --pp 2 --nmb 2 --out "$d" >> "$d.txt" 2>&1
    newer=$(cd "$d" && find . -type f -newer "../regen.stamp" | sort | tr '\n' ' ')
    if [ "$newer" = "./stage1.c " ] && ! grep -q edited "$d/stage1.c"; then
        pass regenerate-rewrites-only-changed-files
    else
        fail regenerate-rewrites-only-changed-files "rewritten: '$newer' (want ./stage1.c only)"
    fi
else
    fail regenerate-rewrites-only-changed-files "gen failed: $(head -n 1 "$d.txt")"
fi

# -- The memory plan: make inspect's numbers are what the program allocates ---------------------

# The library allocates every device buffer from the stage's plan (program.lua) and checks at
# start that the bytes it allocated are the plan's total; inspect prints the same plan. So: the
# report's per-stage totals are the constants the programs check, and a wrong constant stops
# the program (the check runs).
for name in tp2-pp4-nmb8-sp pp2-nmb2; do
    [ -f "$S/$name/report.txt" ] || continue
    want=$(sed -n '/^device memory per rank/,$p' "$S/$name/report.txt" |
           awk 'NR > 2 { print $(NF - 1) "_" $NF }')
    ok=1
    k=0
    for t in $want; do
        bytes=$(sed -n 's/.*\.mem_bytes = \([0-9]*\),.*/\1/p' "$S/$name/stage$k.c")
        # the report rounds: compare through the same formatting (util.bytes, 2 decimals)
        text=$(awk -v b="$bytes" 'BEGIN { split("B KiB MiB GiB TiB", u, " "); i = 1;
               while (b >= 1024 && i < 5) { b /= 1024; i++ }
               if (i == 1) printf "%d_%s", b, u[i]; else printf "%.2f_%s", b, u[i] }')
        [ "$text" = "$t" ] || { ok=0; echo "  stage $k: report $t, stage$k.c $bytes ($text)"; }
        k=$((k + 1))
    done
    if [ $ok = 1 ] && [ $k -gt 0 ]; then pass "memory-plan-report/$name"
    else fail "memory-plan-report/$name" "make inspect's device totals differ from the stages'"; fi
done
if [ -f "$S/pp2-nmb2/stage1.c" ]; then
    d=$S/plan-tampered
    rm -rf "$d" && cp -r "$S/pp2-nmb2" "$d"
    sed -i 's/\(\.mem_bytes = \)\([0-9]*\),/\1\24,/' "$d/stage1.c"
    if make -s GEN_DIR="$d" GEN_OBJ="$S/obj/plan-tampered" "$d/train" > "$d.txt" 2>&1 &&
       ! timeout 60 $MPIRUN -np 2 "$d/train" --steps 0 >> "$d.txt" 2>&1 &&
       grep -q "the generator's plan says" "$d.txt"; then
        pass memory-plan-checked
    else
        fail memory-plan-checked "a stage whose plan is 4 bytes off was not refused: $(tail -n 1 "$d.txt")"
    fi
fi

# -- make MODEL=gpt3_175b TP=8 PP=8 ------------------------------------------------------------

g3=$S/gpt3_175b-tp8-pp8-dp1
nvcc_found=$(make -s echo | sed -n 's/^nvcc: \([a-z ]*found\).*/\1/p')
cuda=$(make -s echo | grep -c 'cuda backend enabled')
if [ "$nvcc_found" != "found" ]; then
    skip gpt3-175b-tp8-pp8 "nvcc not found (the CPU program is still generated and compiled)"
fi
start=$(date +%s)
if ! $GEN gpt3_175b --tp 8 --pp 8 --out "$g3" > "$g3.gen.txt" 2>&1; then
    fail gpt3-175b-tp8-pp8 "gen failed: $(grep -m1 error "$g3.gen.txt")"
else
    targets="$g3/train"
    if [ "$cuda" = 1 ]; then targets="$targets $g3/train_cuda"
    elif [ "$nvcc_found" = "found" ]; then targets="$targets $S/obj/gpt3/kernels_cuda.o"; fi
    # shellcheck disable=SC2086
    if ! make -s -j2 GEN_DIR="$g3" GEN_OBJ="$S/obj/gpt3" $targets > "$g3.make.txt" 2>&1; then
        sed 's/^/    /' "$g3.make.txt" | grep -v '^ *\(CC\|NVCC\|LINK\) ' | head -n 10
        fail gpt3-175b-tp8-pp8 "compiling failed: $(grep -m1 -i error "$g3.make.txt")"
    else
        n=$(ls "$g3"/stage*.c | wc -l)
        if [ "$n" -ne 8 ]; then
            fail gpt3-175b-tp8-pp8 "$n stage sources, want 8"
        elif [ "$nvcc_found" = "found" ]; then
            echo "gpt3_175b tp8 pp8: generated and compiled ($targets)" \
                 "in $(( $(date +%s) - start )) s"
            pass gpt3-175b-tp8-pp8
        else
            pass gpt3-175b-tp8-pp8-cpu
        fi
    fi
fi

exit $status
