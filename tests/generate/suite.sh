#!/bin/bash
# tests/generate/suite.sh: out/<dir>/generate (lib/generate.c) end to end on tiny GPT and tiny
# Llama models, random weights from the double-precision reference (--random-init,
# --save-init), against the reference's own greedy generation (gpt2_ref --generate: a whole
# forward pass per new token, no cache):
#   greedy-*      the same tokens for a fixed prompt and length
#   logits-*      the logits of every generated position: |ours - ref| <= 1e-5 * max(1, the
#                 row's largest |ref|) (f32 through 8 layers against f64: measured 3e-7)
#   cache-*       the KV-cache decoding against --no-kv-cache (every position recomputed for
#                 each token), sampled so that the sequence wanders: the same tokens, logits
#                 within 1e-5 (measured 2.4e-7: only the GEMMs' shapes differ); a cache bug
#                 (a wrong position, a stale or missing row) moves them by the logits' size
#   cuda-emu-*    generate_cuda over the CPU emulation of CUDA: the CPU program's tokens,
#                 logits within 1e-5
#   layout        the generate program of a TP=2 directory gives the TP=1 one's tokens and
#                 logits bit for bit (it runs the model on one process, not the layout)
#   seed, top-k-1, top-p-tiny, eos, prompt-text   decoding: the same seed the same text and
#                 another seed another; top-k 1 and a tiny top-p are greedy; --eos stops;
#                 --prompt is read as bytes and streamed back
#   errors        clear messages for bad flags, prompts, ids, lengths, checkpoints, MoE
# Prints PASS/FAIL/SKIP generate/<name> (tests/lib.sh). A few CPU seconds.
. "$(dirname "$0")/../lib.sh" generate

TOL=1e-5
PROMPT=72,101,108,108,111
GPT_REF="--layers 8 --hidden 64 --heads 4 --seq 64 --vocab 256"
LLAMA_REF="--arch llama --layers 8 --hidden 64 --heads 8 --kv-heads 4 --ffn 128 --seq 64 --vocab 256"

if ! make -s --no-print-directory build/gen build/libgpt_cpu.a build/librt_cpu_single.a \
        build/lib/generate_main.o build/ref/gpt2_ref > "$S/make.log" 2>&1; then
    fail setup "make: $(first_error "$S/make.log")"
    finish
fi
mkdir -p "$S/out"
GPT=$S/out/tiny LLAMA=$S/out/tiny_llama LLAMA2=$S/out/tiny_llama_tp2 MOE=$S/out/tiny_moe
for spec in "$GPT tiny" "$LLAMA tiny_llama" "$LLAMA2 tiny_llama --tp 2" "$MOE tiny_moe"; do
    # shellcheck disable=SC2086 # spec: the directory and the generator's words
    if ! TARGET=generate gen_build $spec; then
        fail build "$WHY"
        finish
    fi
done

# ids FILE: the bytes of a byte model's output as ids, the final newline dropped
ids() { od -An -v -tu1 "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ 10 $//; s/ $//'; }

# -- Against the reference -----------------------------------------------------------------------
for arch in gpt llama; do
    if [ $arch = gpt ]; then dir=$GPT ref=$GPT_REF; else dir=$LLAMA ref=$LLAMA_REF; fi
    # shellcheck disable=SC2086 # ref: the reference's words
    if ! build/ref/gpt2_ref $ref --random-init 7 --save-init "$S/$arch.st" --generate 24 \
            --prompt-ids $PROMPT --gen-logits "$S/$arch.ref.f64" > "$S/$arch.ref.log" 2>&1; then
        fail "greedy-$arch" "gpt2_ref: $(first_error "$S/$arch.ref.log")"
        continue
    fi
    if ! "$dir/generate" --init "$S/$arch.st" --prompt-ids $PROMPT --max-new-tokens 24 \
            --temperature 0 --logits "$S/$arch.f32" > "$S/$arch.out" 2> "$S/$arch.err"; then
        fail "greedy-$arch" "generate: $(first_error "$S/$arch.err")"
        continue
    fi
    want=$(sed -n 's/^tokens: //p' "$S/$arch.ref.log") got=$(ids "$S/$arch.out")
    if [ "$got" = "$want" ]; then pass "greedy-$arch"
    else fail "greedy-$arch" "tokens '$got', the reference's '$want'"; fi
    if python3 tests/generate/logits_cmp.py "$S/$arch.f32" "$S/$arch.ref.f64" 256 $TOL \
            > "$S/$arch.cmp" 2>&1; then pass "logits-$arch"
    else fail "logits-$arch" "$(tail -n 1 "$S/$arch.cmp") > $TOL"; fi
    if ! grep -q "prompt 5 tokens, 24 new tokens; prefill .* tok/s), decode .* tok/s)" \
            "$S/$arch.err"; then
        fail "report-$arch" "stderr lacks the prompt, new tokens and tokens/s: $(head -c 200 \
            "$S/$arch.err")"
    else
        pass "report-$arch"
    fi

    # the cache against recomputing every position (sampled: the sequence goes anywhere)
    sample=(--init "$S/$arch.st" --prompt-ids $PROMPT --max-new-tokens 50 --seed 5)
    "$dir/generate" "${sample[@]}" --logits "$S/$arch.c.f32" > "$S/$arch.c.out" 2> /dev/null
    "$dir/generate" "${sample[@]}" --no-kv-cache --logits "$S/$arch.n.f32" > "$S/$arch.n.out" \
        2> /dev/null
    if ! cmp -s "$S/$arch.c.out" "$S/$arch.n.out"; then
        fail "cache-$arch" "the tokens differ with and without the KV cache"
    elif ! python3 tests/generate/logits_cmp.py "$S/$arch.c.f32" "$S/$arch.n.f32" 256 $TOL \
            > "$S/$arch.cn.cmp" 2>&1; then
        fail "cache-$arch" "cached vs recomputed logits: $(tail -n 1 "$S/$arch.cn.cmp") > $TOL"
    else
        pass "cache-$arch"
    fi
done

# -- One process whatever the layout -------------------------------------------------------------
"$LLAMA2/generate" --init "$S/llama.st" --prompt-ids $PROMPT --max-new-tokens 24 \
    --temperature 0 --logits "$S/llama2.f32" > "$S/llama2.out" 2> "$S/llama2.err"
if cmp -s "$S/llama2.out" "$S/llama.out" && cmp -s "$S/llama2.f32" "$S/llama.f32"; then
    pass layout
else
    fail layout "the TP=2 directory's generate differs from the TP=1 one's:" \
        "$(first_error "$S/llama2.err")"
fi

# -- The CUDA backend on the CPU emulation of CUDA (tests/kernels/emu.mk: generate_cuda_emu) ---
# generate_cuda's whole path (its kernels, device memory, cuBLAS's arguments) without a GPU:
# the CPU program's greedy tokens, logits within the same 1e-5 (measured 1.8e-7).
if ! command -v g++ > /dev/null 2>&1 || [ "$(uname -m)" != x86_64 ]; then
    skip cuda-emu "needs g++ (make deps installs it) and x86-64 (the emulation's fibers)"
else
    for arch in gpt llama; do
        if [ $arch = gpt ]; then dir=$GPT; else dir=$LLAMA; fi
        if ! GEN_MAKEFILES="-f Makefile -f tests/kernels/emu.mk" TARGET=generate_cuda_emu \
                gen_build "$dir"; then
            fail "cuda-emu-$arch" "$WHY"
            continue
        fi
        for p in generate generate_cuda_emu; do
            "$dir/$p" --init "$S/$arch.st" --prompt-ids $PROMPT --max-new-tokens 8 \
                --temperature 0 --logits "$S/$arch.$p.f32" > "$S/$arch.$p.out" 2> "$S/$arch.$p.err"
        done
        if ! cmp -s "$S/$arch.generate.out" "$S/$arch.generate_cuda_emu.out"; then
            fail "cuda-emu-$arch" "tokens differ from the CPU program's:" \
                "$(first_error "$S/$arch.generate_cuda_emu.err")"
        elif ! python3 tests/generate/logits_cmp.py "$S/$arch.generate_cuda_emu.f32" \
                "$S/$arch.generate.f32" 256 $TOL > "$S/$arch.emu.cmp" 2>&1; then
            fail "cuda-emu-$arch" "logits: $(tail -n 1 "$S/$arch.emu.cmp") > $TOL"
        else
            pass "cuda-emu-$arch"
        fi
    done
fi

# -- Decoding ------------------------------------------------------------------------------------
run() { "$GPT/generate" --init "$S/gpt.st" --prompt-ids $PROMPT --max-new-tokens 40 "$@" \
            2> /dev/null; }
a=$(run --seed 1 | od -An -tx1) b=$(run --seed 1 | od -An -tx1) c=$(run --seed 2 | od -An -tx1)
if [ "$a" != "$b" ]; then fail seed "two runs with --seed 1 differ"
elif [ "$a" = "$c" ]; then fail seed "--seed 1 and --seed 2 give the same 40 tokens"
else pass seed; fi
greedy=$(run --temperature 0 | od -An -tx1)
[ "$(run --top-k 1 --seed 3 | od -An -tx1)" = "$greedy" ] && pass top-k-1 ||
    fail top-k-1 "--top-k 1 differs from --temperature 0"
[ "$(run --top-p 1e-9 --temperature 2 | od -An -tx1)" = "$greedy" ] && pass top-p-tiny ||
    fail top-p-tiny "--top-p 1e-9 differs from --temperature 0"
read -r -a g <<< "$(ids "$S/gpt.out")"
eos=${g[6]}                  # the second new token: it ends the text at its first time
first=5
while [ "${g[$first]}" != "$eos" ]; do first=$((first + 1)); done
got=$(run --temperature 0 --eos "$eos" > "$S/eos.out"; ids "$S/eos.out")
want=$(echo "${g[@]:0:$((first + 1))}")
[ "$got" = "$want" ] && pass eos || fail eos "--eos $eos: '$got', expected '$want'"
"$GPT/generate" --init "$S/gpt.st" --prompt "Hi there" --max-new-tokens 3 --temperature 0 \
    > "$S/text.out" 2> "$S/text.err"
if [ "$(head -c 8 "$S/text.out")" = "Hi there" ] && [ "$(wc -c < "$S/text.out")" = 12 ]; then
    pass prompt-text
else
    fail prompt-text "--prompt 'Hi there' and 3 tokens: '$(head -c 40 "$S/text.out")'"
fi

# -- Errors: status 2 (usage) or 1 (a file), the first line ------------------------------------
long=$(printf 'x%.0s' $(seq 64))
ERRORS="2|--prompt-ids 1|generate: error: --init PATH is needed
2|--init $S/gpt.st|generate: error: a prompt is needed: --prompt TEXT or --prompt-ids LIST
2|--init $S/gpt.st --prompt a --prompt-ids 1|generate: error: --prompt and --prompt-ids exclude each other
2|--init $S/gpt.st --prompt-ids 1,256|generate: error: --prompt-ids: id 256 (token 2 of the prompt) is outside the model's vocabulary [0, 256)
2|--init $S/gpt.st --prompt-ids 1,,2|generate: error: --prompt-ids expects token ids separated by commas, got '1,,2'
2|--init $S/gpt.st --prompt $long|generate: error: the prompt has 64 tokens; the model (models/tiny.lua) has 64 positions
2|--init $S/gpt.st --prompt-ids 1,2 --max-new-tokens 63|generate: error: the prompt (2 tokens) and --max-new-tokens 63 need 65 positions; the model (models/tiny.lua) has 64 (seq_len): at most --max-new-tokens 62
2|--init $S/gpt.st --prompt-ids 1 --eos 256|generate: error: --eos 256 is outside the model's vocabulary [0, 256)
2|--init $S/gpt.st --prompt-ids 1 --top-p 0|generate: error: --top-p must be in (0, 1], got 0
2|--init $S/gpt.st --prompt-ids 1 --temperature -1|generate: error: --temperature must be >= 0
2|--init $S/gpt.st --prompt-ids 1 --top-k x|generate: error: --top-k expects a non-negative integer, got 'x'
2|--init $S/gpt.st --prompt-ids 1 --steps 3|generate: error: unknown flag '--steps' (try --help)
2|--init $S/gpt.st --prompt-ids 1 --seed|generate: error: --seed needs a value (try --help)
1|--init $S/nothing.st --prompt-ids 1|$S/nothing.st: error:
1|--init $S/llama.st --prompt-ids 1|$S/llama.st: error: this file holds Llama tensor names"
n=0 bad=""
while IFS='|' read -r code args want; do
    n=$((n + 1))
    # shellcheck disable=SC2086 # args: words
    "$GPT/generate" $args > "$S/err$n.out" 2> "$S/err$n.err" < /dev/null
    rc=$?
    line=$(head -n 1 "$S/err$n.err")
    if [ "$rc" != "$code" ] || [ "${line#"$want"}" = "$line" ] || [ -s "$S/err$n.out" ]; then
        bad="$bad; generate $args: status $rc, '$line' (expected $code, '$want')"
    fi
done <<< "$ERRORS"
"$MOE/generate" --init "$S/gpt.st" --prompt-ids 1 > /dev/null 2> "$S/moe.err"
rc=$? line=$(head -n 1 "$S/moe.err")
want="generate: error: models/tiny_moe.lua is a mixture-of-experts model: generate runs dense"
[ "$rc" = 2 ] && [ "${line#"$want"}" != "$line" ] || bad="$bad; tiny_moe: status $rc, '$line'"
"$GPT/generate" --help > "$S/help.out" 2>&1 && grep -q -- '--top-p X' "$S/help.out" ||
    bad="$bad; --help: $(head -n 1 "$S/help.out")"
[ -z "$bad" ] && pass errors || fail errors "${bad#; }"
finish
