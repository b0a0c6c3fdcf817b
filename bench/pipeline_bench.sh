#!/bin/sh
# bench/pipeline_bench.sh: what pipeline parallelism costs at build time and buys at run time
# Not part of make test; prints a report, writes scratch under build/bench/pipeline/.
#  1. make MODEL=gpt3_175b TP=8 PP=8: from scratch (generate + compile train and, with CUDA,
#     train_cuda), from scratch with make -j, and again with nothing changed (warm);
#  2. the CPU pipeline's tokens/s for PP=2 and PP=4 (1F1B and interleaved) over several
#     micro-batch counts, against the single rank and the bubble the schedule predicts:
#     ideal = P x (single-rank tokens/s) / (1 + bubble), one thread per rank; with more
#     ranks than cores the cores bound it instead (ranks time-share; a waiting rank's core
#     serves its neighbour).
# Usage: [ROUNDS=2] bench/pipeline_bench.sh [STEPS]   (8 steps per run, the first 2 untimed;
# every layout runs ROUNDS times, interleaved, and its fastest step counts: timings on a shared
# machine are noisy, run it when nothing else runs).

cd "$(dirname "$0")/.." || exit 2
B=build/bench/pipeline
STEPS=${1:-8}
mkdir -p "$B"
make -s all ref > "$B/make.txt" 2>&1 || { echo "make all ref failed (see $B/make.txt)"; exit 1; }

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
cores=$(nproc)

# -- 1. Build time of gpt3_175b TP=8 PP=8 ------------------------------------------------------

echo "== make MODEL=gpt3_175b TP=8 PP=8 ($(make -s echo | grep -o 'cuda backend [a-z]*')," \
     "$cores cores)"
G3=out/gpt3_175b-tp8-pp8-dp1
clean_g3() { rm -rf "$G3" "build/$G3"; }
clean_g3
t=$(now); build/gen gpt3_175b --tp 8 --pp 8 > "$B/g3_gen.txt" 2>&1 || exit 1
echo "generate only (build/gen)            $(since "$t") s   $(ls "$G3" | wc -l) files," \
     "$(cat "$G3"/*.c "$G3"/*.h | wc -l) lines of C"
clean_g3
t=$(now); make MODEL=gpt3_175b TP=8 PP=8 > "$B/g3_scratch.txt" 2>&1 || exit 1
echo "from scratch, make                   $(since "$t") s"
clean_g3
t=$(now); make -j"$cores" MODEL=gpt3_175b TP=8 PP=8 > "$B/g3_scratch_j.txt" 2>&1 || exit 1
echo "from scratch, make -j$cores                $(since "$t") s"
t=$(now); make MODEL=gpt3_175b TP=8 PP=8 > "$B/g3_warm.txt" 2>&1 || exit 1
echo "warm (nothing changed)               $(since "$t") s   ($(grep -c '^ *\(CC\|NVCC\|LINK\) ' \
     "$B/g3_warm.txt") compile/link steps)"
touch templates/program/stage.c.tmpl
t=$(now); make MODEL=gpt3_175b TP=8 PP=8 > "$B/g3_touch.txt" 2>&1 || exit 1
echo "warm, a template touched (same text) $(since "$t") s   ($(grep -c '^ *\(CC\|NVCC\|LINK\) ' \
     "$B/g3_touch.txt") compile/link steps)"

# -- 2. CPU pipeline throughput ------------------------------------------------------------------

# A model big enough for its GEMMs to dominate on a CPU, small enough for seconds per step:
# 8 layers, hidden 256, sequence 128, byte vocabulary (6.4 M parameters).
cat > "$B/pipe_bench.lua" << 'EOF'
return gpt {
    description = "pipeline benchmark (bench/pipeline_bench.sh)",
    layers  = 8,
    hidden  = 256,
    heads   = 8,
    seq_len = 128,
    vocab   = 256,
}
EOF
build/ref/make_tokens --vocab 256 --tokens 400000 --seed 3 "$B/tokens.bin" > /dev/null || exit 1
MPIRUN="mpirun --oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
MBS=2

CONFIGS="1:1:8 2:1:2 2:1:4 2:1:8 2:1:16 2:2:4 2:2:8 4:1:4 4:1:8 4:1:16 4:2:8"   # P:V:M
ROUNDS=${ROUNDS:-2}

name_of() { echo "pp$1-vp$2-nmb$3"; }

# build P V M: generate and compile the layout
build() {
    d=$B/$(name_of "$1" "$2" "$3")
    build/gen "$B/pipe_bench.lua" --mbs $MBS --pp "$1" --vp "$2" --nmb "$3" --out "$d" \
        > "$d.gen.txt" 2>&1 &&
        make -s -j"$cores" GEN_DIR="$d" GEN_OBJ="$B/obj/${d##*/}" "$d/train" > "$d.make.txt" 2>&1
}

# run P V M ROUND: train $STEPS steps with one thread per rank; prints the best tokens/s of the
# timed steps (the machine may be shared: the fastest step is the least disturbed one)
run() {
    name=$(name_of "$1" "$2" "$3")
    d=$B/$name
    log=$d.$4.jsonl
    w=$(sed -n 's/^{"model": "[^"]*", "world": \([0-9]*\),.*/\1/p' "$d/topology.json")
    set -- "$d/train" --data "$B/tokens.bin" --steps "$STEPS" --log "$log" --quiet
    if [ "$w" -gt 1 ]; then
        RT_THREADS=1 $MPIRUN -x RT_THREADS -np "$w" "$@" < /dev/null > "$d.run.txt" 2>&1
    else
        RT_THREADS=1 "$@" < /dev/null > "$d.run.txt" 2>&1
    fi || { echo "run of $name failed: $(tail -n 1 "$d.run.txt")" >&2; return 1; }
    sed -n 's/.*"tok_s":\([0-9.]*\).*/\1/p' "$log" | tail -n +3 | sort -n | tail -n 1
}

for c in $CONFIGS; do
    IFS=: read -r P V M << EOF2
$c
EOF2
    build "$P" "$V" "$M" || { echo "build of $(name_of "$P" "$V" "$M") failed"; exit 1; }
done
: > "$B/tok_s.txt"
for round in $(seq "$ROUNDS"); do
    for c in $CONFIGS; do
        IFS=: read -r P V M << EOF2
$c
EOF2
        t=$(run "$P" "$V" "$M" "$round") && [ -n "$t" ] && echo "$c $t" >> "$B/tok_s.txt"
    done
done

echo
echo "== CPU pipeline, tokens/s ($cores cores, 1 thread per rank, micro-batch $MBS x 128 tokens;" \
     "best step of $ROUNDS x $((STEPS - 2)); load average now $(cut -d' ' -f1-3 /proc/loadavg))"
printf "%-16s %5s %9s %9s %9s %10s  %s\n" layout ranks bubble "tok/s" ideal "meas/ideal" note
awk -v cores="$cores" -v configs="$CONFIGS" '
    { if (!($1 in best) || $2 > best[$1]) best[$1] = $2 }
    END {
        n = split(configs, order, " ")
        one = best["1:1:8"]
        for (i = 1; i <= n; i++) {
            if (!(order[i] in best)) continue
            split(order[i], c, ":"); P = c[1]; V = c[2]; M = c[3]; tok = best[order[i]]
            name = "pp" P (V > 1 ? " vp" V : "") " nmb" M
            if (P == 1) {
                printf "%-16s %5d %9s %9.0f %9s %10s\n", name, 1, "-", tok, "-", "-"
                continue
            }
            b = (P - 1) / (V * M)
            if (P <= cores) { ideal = P * one / (1 + b); note = "" }
            else { ideal = cores * one; note = "cores-bound: " P " ranks on " cores " cores" }
            printf "%-16s %5d %9.3f %9.0f %9.0f %10.2f  %s\n", name, P, b, tok, ideal,
                   tok / ideal, note
        }
    }' "$B/tok_s.txt"
