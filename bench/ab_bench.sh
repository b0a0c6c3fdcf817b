#!/bin/bash
# bench/ab_bench.sh: this tree's training step against the same program built from another git
# revision, on this machine in the same run: did a change slow a normal step? (never part of
# make test). Both trees generate the same model and layout; the runs alternate (A B A B ...)
# so that a drift of the machine hits both alike. Prints per program the median ms/step of
# each round (the first WARMUP steps dropped), the median over rounds, and B/A.
#
#   bench/ab_bench.sh REV [tiny] [gpt2-t64]       (default: both)
#   ROUNDS=N (5)  STEPS=N (tiny 60, gpt2-t64 12)  WARMUP=N (tiny 10, gpt2-t64 3)
#   RT_THREADS=t (the runtime's threads; default: the runtime's choice)
#
# A is REV (checked out with git worktree in build/bench/ab/REV and built there), B is this
# tree. tiny: models/tiny.lua, 8 sequences of 64, on tokens from build/ref/make_tokens;
# gpt2-t64: models/gpt2_124m.lua, 4 sequences of 64 tokens, on data/corpus.bin (make data).
# One rank (tp1 pp1 dp1), f32.
cd "$(dirname "$0")/.." || exit 2
REV=${1:?usage: bench/ab_bench.sh REV [tiny] [gpt2-t64]}
shift
what=${*:-tiny gpt2-t64}
ROUNDS=${ROUNDS:-5}
B=build/bench/ab
OLD=$B/$(git rev-parse --short "$REV") || exit 2
mkdir -p $B

make -s --no-print-directory build/gen build/libgpt_cpu.a build/librt_cpu.a ref || exit 1
if [ ! -x "$OLD/build/gen" ]; then
    rm -rf "$OLD"
    git worktree add -f "$OLD" "$REV" > /dev/null 2>&1 || { echo "cannot check out $REV"; exit 1; }
    make -s --no-print-directory -C "$OLD" build/gen build/libgpt_cpu.a build/librt_cpu.a \
        > "$OLD.build.log" 2>&1 || { echo "cannot build $REV: see $OLD.build.log"; exit 1; }
fi
[ -f $B/tok.bin ] || build/ref/make_tokens --vocab 256 --tokens 40000 $B/tok.bin > /dev/null

# prog TREE NAME GEN-ARGS...: generate and build NAME in TREE; prints the program's path
prog() {
    local tree=$1 name=$2 dir
    shift 2
    dir=$(realpath "$B")/$(basename "$tree")-$name
    (cd "$tree" && build/gen "$@" --out "$dir" > "$dir.gen.log" 2>&1 &&
     make -s --no-print-directory GEN_DIR="$dir" GEN_OBJ="$dir.obj" "$dir/train" \
        > "$dir.build.log" 2>&1) || { echo "cannot build $name in $tree" >&2; return 1; }
    echo "$dir/train"
}

# median of the ms of steps > WARMUP in a JSON log
median_ms() {
    sed -n 's/.*"step":\([0-9]*\),.*"ms":\([0-9.]*\).*/\1 \2/p' "$1" |
        awk -v w="$2" '$1 > w { print $2 }' | sort -n |
        awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'
}

printf '%-9s %-6s %s\n' program tree "ms/step per round (median of each)"
for w in $what; do
    case $w in
        tiny) args=(tiny); data=$B/tok.bin; steps=${STEPS:-60}; warm=${WARMUP:-10} ;;
        gpt2-t64) args=(gpt2_124m --seq 64 --mbs 4); data=data/corpus.bin
                  steps=${STEPS:-12}; warm=${WARMUP:-3}
                  [ -f "$data" ] || make -s data ;;
        *) echo "unknown program $w (tiny, gpt2-t64)"; exit 2 ;;
    esac
    a=$(prog "$OLD" "$w" "${args[@]}") || exit 1
    b=$(prog . "$w" "${args[@]}") || exit 1
    ra=() rb=()
    for ((r = 1; r <= ROUNDS; r++)); do
        for side in a b; do
            p=$a; [ $side = b ] && p=$b
            "$p" --data "$data" --steps "$steps" --quiet --log $B/run.jsonl > $B/run.log 2>&1 ||
                { echo "run failed: $p"; cat $B/run.log; exit 1; }
            m=$(median_ms $B/run.jsonl "$warm")
            if [ $side = a ]; then ra+=("$m"); else rb+=("$m"); fi
        done
    done
    ma=$(printf '%s\n' "${ra[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
    mb=$(printf '%s\n' "${rb[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
    printf '%-9s %-6s %s  -> %s\n' "$w" "A $REV" "${ra[*]}" "$ma"
    printf '%-9s %-6s %s  -> %s\n' "$w" "B this" "${rb[*]}" "$mb"
    awk -v a="$ma" -v b="$mb" -v w="$w" 'BEGIN { printf "%-9s B/A = %.3f\n", w, b / a }'
done
