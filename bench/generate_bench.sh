#!/bin/sh
# bench/generate_bench.sh: our generate program (lib/generate.c, CPU) against PyTorch (eager,
# CPU, f32, bench/torch_generate.py) on the same model, weights and prompt, greedy, in one run
# (never part of make test). Per model and thread count: prefill and decode tokens/s of both
# and their ratio, and whether the two generated the same tokens.
#
#   bench/generate_bench.sh [tiny] [tiny_llama] [gpt2_124m]     (default: all three)
#   THREADS="1 2"  NEW=N (new tokens; default 48 for the tiny models, 128 for gpt2_124m)
#   NO_TORCH=1 (ours only)
#
# Weights: each model's seeded initialisation, written by its train_single --steps 0 --save
# (gpt2_124m: 124M parameters, a 500 MB file). Prompts: 16 ids for the tiny models (seq 64),
# 64 for gpt2_124m, fixed. Threads pinned with taskset to cores 0..t-1; ours RT_THREADS = t,
# PyTorch torch.set_num_threads(t) with OMP_NUM_THREADS = t and OMP_WAIT_POLICY=PASSIVE.
# Timing: prefill is the prompt's forward and the first token; decode the remaining tokens,
# one forward each with the cache. One run each; on the shared 2-core VM the numbers vary by
# tens of percent with other load.
# Without torch (python3 that imports it) the PyTorch rows print SKIP and say so.
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
THREADS=${THREADS:-1 2}
B=build/bench/generate
mkdir -p $B
what=${*:-tiny tiny_llama gpt2_124m}
have_torch=1
if [ -n "$NO_TORCH" ] || ! $PY -c 'import torch' > /dev/null 2>&1; then have_torch=0; fi
make -s --no-print-directory build/gen build/libgpt_cpu.a build/librt_cpu_single.a \
    build/lib/generate_main.o || exit 1

# ids N: N fixed prompt ids below 256
ids() { seq 1 "$1" | awk '{ printf "%s%d", (NR > 1 ? "," : ""), (NR * 37 + 11) % 256 }'; }

for model in $what; do
    d=$B/$model
    if [ ! -f "$d/topology.json" ]; then
        build/gen "$model" --mbs 1 --out "$d" > "$d.gen.log" 2>&1 || { cat "$d.gen.log"; exit 1; }
    fi
    make -s --no-print-directory GEN_DIR="$d" GEN_OBJ="$d.obj" "$d/generate" "$d/train_single" \
        || exit 1
    [ -f "$d/init.safetensors" ] ||
        "$d/train_single" --steps 0 --save "$d/init.safetensors" --quiet > "$d.init.log" 2>&1 ||
        { cat "$d.init.log"; exit 1; }
    case $model in
    tiny) p=16 n=${NEW:-48} arch="--arch gpt --heads 4" ;;
    tiny_llama) p=16 n=${NEW:-48} arch="--arch llama --heads 8 --kv-heads 4" ;;
    gpt2_124m) p=64 n=${NEW:-128} arch="--arch gpt --heads 12" ;;
    *) echo "generate_bench: no settings for model '$model'"; exit 2 ;;
    esac
    prompt=$(ids $p)
    for t in $THREADS; do
        cores=0-$((t - 1))
        RT_THREADS=$t taskset -c $cores "$d/generate" --init "$d/init.safetensors" \
            --prompt-ids "$prompt" --max-new-tokens "$n" --temperature 0 \
            > "$d.ours.$t.out" 2> "$d.ours.$t.err" || { cat "$d.ours.$t.err"; exit 1; }
        # "generate: prompt P tokens, N new tokens; prefill X ms (Y tok/s), decode X ms (Y tok/s)"
        ours=$(sed -n 's/.*prefill [0-9.]* ms (\([0-9.]*\) tok\/s), decode [0-9.]* ms (\([0-9.]*\) tok\/s).*/\1 \2/p' \
               "$d.ours.$t.err")
        set -- $ours
        printf '%-11s %d thr  ours:    prefill %9.1f tok/s  decode %8.1f tok/s  (prompt %d, %d new)\n' \
            "$model" "$t" "$1" "$2" "$p" "$n"
        if [ $have_torch = 0 ]; then
            echo "SKIP $model $t thr  PyTorch: no python3 with torch here (NO_TORCH or not installed)"
            continue
        fi
        OMP_NUM_THREADS=$t OMP_WAIT_POLICY=PASSIVE taskset -c $cores $PY bench/torch_generate.py \
            --init "$d/init.safetensors" $arch --prompt-ids "$prompt" --new "$n" --threads "$t" \
            > "$d.torch.$t.out" 2> "$d.torch.$t.err" || { cat "$d.torch.$t.err"; exit 1; }
        tp=$(sed -n 's/.*"prefill_tok_s": \([0-9.e+-]*\).*/\1/p' "$d.torch.$t.out")
        td=$(sed -n 's/.*"decode_tok_s": \([0-9.e+-]*\).*/\1/p' "$d.torch.$t.out")
        ours_ids=$(head -n 1 "$d.ours.$t.out" | tr -s ' ' ' ' | sed 's/ $//')
        [ "$model" = gpt2_124m ] || ours_ids=$(od -An -v -tu1 "$d.ours.$t.out" |
            tr -s ' \n' ' ' | sed 's/^ //; s/ 10 $//; s/ $//')
        torch_ids=$(sed -n 's/^tokens: //p' "$d.torch.$t.out")
        same=no
        [ "$ours_ids" = "$torch_ids" ] && same=yes
        printf '%-11s %d thr  PyTorch: prefill %9.1f tok/s  decode %8.1f tok/s  ours/PyTorch: %.2fx, %.2fx; same tokens: %s\n' \
            "$model" "$t" "$tp" "$td" "$(awk "BEGIN { print $1 / $tp }")" "$(awk "BEGIN { print $2 / $td }")" "$same"
    done
done
