#!/bin/bash
# bench/memory_bench.sh: the activation memory per pipeline stage, before and after the
# chunks of an interleaved stage shared one pool of activation slots and the gradients of the
# stage's outputs got buffers of their own (one or two, not one per slot) (issue: "memory the
# schedule never uses"). For each layout it prints, per stage, the micro-batches in flight at
# most (the schedule's), the slots and the peak activation bytes per rank at REV and at HEAD,
# as `make inspect` reports them (the exact plan each program allocates and checks at start).
# Not part of make test; builds build/gen of REV in build/bench/memory-<rev>/.
#   bench/memory_bench.sh [REV]
#     REV: the "before" commit; default: the parent of the commit that made the pool.
cd "$(dirname "$0")/.." || exit 2
rev=$1
if [ -z "$rev" ]; then
    pool=$(git log --format=%H -1 --grep='share one pool of activation slots')
    [ -n "$pool" ] || { echo "bench: no commit made the pool here; give REV" >&2; exit 2; }
    rev=$pool^
fi
short=$(git rev-parse --short "$rev") || exit 2
dir=build/bench/memory-$short
if [ ! -x "$dir/build/gen" ]; then
    rm -rf "$dir"
    mkdir -p build/bench
    git clone -q . "$dir" && git -C "$dir" checkout -q "$short" &&
        make -s -C "$dir" build/gen > "$dir.log" 2>&1 ||
        { echo "bench: cannot build build/gen at $short (see $dir.log)" >&2; exit 1; }
fi
make -s build/gen || exit 1

LAYOUTS=(
    "llama3_70b --tp 8 --pp 4 --vp 2 --dp 1 --nmb 16 --sp"
    "llama3_70b --tp 8 --pp 4 --vp 2 --dp 1 --nmb 16 --sp --bf16 --recompute selective"
    "mixtral_8x7b --tp 2 --pp 4 --vp 2 --dp 8 --ep 8 --nmb 16 --sp --bf16"
    "gpt3_175b --tp 8 --pp 8 --vp 2 --dp 16 --nmb 64 --sp --dist-opt --bf16"
    "gpt3_175b --tp 8 --pp 8 --dp 16 --nmb 64 --sp --dist-opt --bf16 --recompute full --recompute-method uniform --recompute-layers 1"
)

# rows GEN ARGS...: "stage inflight slots peak" per stage of the pipeline table of --inspect
rows() {
    local gen=$1
    shift
    # shellcheck disable=SC2068 # the layout's words
    "$gen" --inspect $@ 2>&1 | awk '
        /^  stage  warm-up/ { on = 1; next }
        on && /^  \(/ { exit }
        on && NF >= 8 {
            slots = $6; i = 7
            if ($7 == "shared") { slots = $6 " shared"; i = 8 }
            print $1 "\t" $5 "\t" slots "\t" $(NF - 1) " " $NF
        }'
}

echo "activations per rank, before ($short) and after (HEAD $(git rev-parse --short HEAD))"
for l in "${LAYOUTS[@]}"; do
    echo
    echo "$l"
    printf '  %5s  %9s  %-10s %12s  %-10s %12s\n' stage "in flight" "slots" "before" \
        "slots" "after"
    # shellcheck disable=SC2086 # the layout's words
    paste <(rows "$dir/build/gen" $l) <(rows build/gen $l) |
        awk -F'\t' '{ printf "  %5s  %9s  %-10s %12s  %-10s %12s\n", $1, $2, $3, $4, $7, $8 }'
done
