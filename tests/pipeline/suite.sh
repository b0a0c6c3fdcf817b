#!/bin/bash
# tests/pipeline/suite.sh: pipeline parallelism end to end, on the CPU under mpirun.
#  * every layout of tests/pipeline/layouts.txt trains models/tiny.lua from the same --init on
#    the same global batch as the single-rank program; losses and gradient norms of every step
#    and the --save'd weights must match the single rank's (the table holds the tolerances); the
#    single-rank baseline itself matches the double-precision reference (the oracle);
#  * tied embeddings: the last stage's wte equals the first stage's bit for bit (per-rank resume
#    checkpoint) and --save writes the first stage's; the norm counts it once (grad_norm matches);
#  * a deliberately broken schedule makes build/gen write nothing and print the counterexample;
#  * the device memory make inspect reports is what the program allocates, and checks;
#  * make MODEL=gpt3_175b TP=8 PP=8 generates and compiles, CPU and CUDA (SKIP without nvcc).
# Protocol: tests/lib.sh; scratch in build/test/pipeline/. Run: make test SUITE=pipeline
# (TABLE=FILE runs FILE in place of tests/pipeline/layouts.txt, for a few rows at a time.)
. "$(dirname "$0")/../lib.sh" pipeline
GEN=build/gen

if ! make -s all ref > "$S/make.txt" 2>&1; then
    sed 's/^/    /' "$S/make.txt" | tail -n 20
    fail build "make all ref failed"
    finish
fi

# -- Data, initial weights, the layouts -------------------------------------------------------

build/ref/make_tokens --vocab 256 --tokens 200000 --seed 11 "$S/tokens.bin" > /dev/null || exit 2
build/ref/gpt2_ref --layers 8 --hidden 64 --heads 4 --seq 64 --vocab 256 --random-init 5 \
    --save-init "$S/init.safetensors" > /dev/null || exit 2

# The table's columns are separated by '|', so its --layout strings write '/' for Megatron's
# stage separator '|': gen_build gets them back as written on the command line.
eval "$(declare -f gen_build | sed '1s/^gen_build/lib_gen_build/')"
gen_build() {
    local dir=$1 a prev="" args=()
    shift
    for a; do
        [ "$prev" = --layout ] && a=${a//\//|}
        args+=("$a")
        prev=$a
    done
    lib_gen_build "$dir" "${args[@]}"
}

equiv "${TABLE:-tests/pipeline/layouts.txt}"

# The tied copies: each layout that kept its resume checkpoints (their names in the table's
# last block) has the last stage's wte equal to the first stage's, and saves the first's.
for name in pp4-vp2-nmb8 tp2-pp2-dp2-nmb4 pp2-dp2-vp2-nmb2-distopt tp2-pp3-vp2-first2-last2-nmb6
do
    if [ -z "${DIR[$name]}" ] || [ ! -d "$S/run/$name.ckpt" ]; then
        fail "tied-wte/$name" "$name did not train"
    elif out=$($GEN --lua tests/pipeline/tied.lua "${DIR[$name]}" \
               "$S/run/$name.ckpt/step_00000006" "$S/run/$name.safetensors" 2>&1); then
        pass "tied-wte/$name"
    else
        fail "tied-wte/$name" "$(echo "$out" | tail -n 1)"
    fi
done

# The tied copy is counted once in the gradient norm: with PP > 1 the norm of every step equals
# the single rank's (where wte exists once); counted twice it would grow by |grad wte|.
if [ -f "$S/run/tp2-pp2-dp2-nmb4.jsonl" ] && [ -f "$S/run/base8.jsonl" ]; then
    if d=$($LOGCMP "$S/run/tp2-pp2-dp2-nmb4.jsonl" "$S/run/base8.jsonl" grad_norm=1e-5); then
        pass tied-norm-counted-once
    else
        fail tied-norm-counted-once "tp2 pp2 dp2 grad_norm vs single rank: $(echo "$d" | tail -n 1)"
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
    d=${DIR[$name]}
    [ -f "$d/report.txt" ] || continue
    # the stage rows: ... CPU total (value, unit), GPU total (value, unit)
    want=$(sed -n '/^device memory per rank/,$p' "$d/report.txt" |
           awk '$1 ~ /^[0-9]+$/ { print $(NF - 3) "_" $(NF - 2) }')
    ok=1
    k=0
    for t in $want; do
        bytes=$(sed -n 's/.*\.mem_bytes = \([0-9]*\),.*/\1/p' "$d/stage$k.c")
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
if [ -f "${DIR[pp2-nmb2]}/stage1.c" ]; then
    d=$S/plan-tampered
    rm -rf "$d" && cp -r "${DIR[pp2-nmb2]}" "$d"
    sed -i 's/\(\.mem_bytes = \)\([0-9]*\),/\1\24,/' "$d/stage1.c"
    if make -s GEN_DIR="$d" GEN_OBJ="$S/obj/plan-tampered" "$d/train" > "$d.txt" 2>&1 &&
       ! timeout 60 $MPIRUN -np 2 "$d/train" --steps 0 >> "$d.txt" 2>&1 &&
       grep -q "the generator's plan says" "$d.txt"; then
        pass memory-plan-checked
    else
        fail memory-plan-checked \
            "a stage whose plan is 4 bytes off was not refused: $(tail -n 1 "$d.txt")"
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
    elif [ "$nvcc_found" = "found" ]; then targets="$targets build/lib/kernels_cuda.o"; fi
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

# The sources stay bounded (at most 64 KiB a file) at the README's large
# batch: gpt3_175b TP 8 PP 8 DP 16, 64 micro-batches, VP 2, SP, the distributed optimizer, bf16
# (the schedule is a table of rows; an evaluation runs the same rows, filtered).
big=$S/gpt3-big
if ! $GEN gpt3_175b --tp 8 --pp 8 --dp 16 --nmb 64 --vp 2 --sp --dist-opt --bf16 --out "$big" \
        > "$big.gen.txt" 2>&1; then
    fail gpt3-175b-file-bound "gen failed: $(grep -m1 error "$big.gen.txt")"
else
    largest=$(cd "$big" && ls -S -- *.c *.h build.mk | head -n 1)     # the sources
    size=$(stat -c %s "$big/$largest")
    if [ "$size" -gt 65536 ]; then
        fail gpt3-175b-file-bound "$largest is $size bytes, more than 64 KiB"
    else
        pass gpt3-175b-file-bound
    fi
fi

finish
