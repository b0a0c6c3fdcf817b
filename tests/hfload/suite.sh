#!/bin/bash
# tests/hfload/suite.sh: --init reads Hugging Face checkpoints as save_pretrained writes them:
# one safetensors file, the shards model-0000k-of-0000N.safetensors named by
# model.safetensors.index.json, or a directory holding either; F32 and BF16; a file PyTorch
# wrote (when torch is installed). The model is models/tiny.lua (GPT-2 names); the checkpoints
# are the reference's whole-model file rewritten by tools/stshard. Every load is checked by
# what the program saves after --steps 0: bit for bit the same as the single file's load.
# Bad checkpoints must fail before any training with the exact messages below; GPT-2 names
# with GPT2LMHeadModel's "transformer." prefix load, and its lm_head.weight when it is the
# embedding's copy. Then, where models/tiny_llama.lua and tiny_mixtral.lua are, their own
# checkpoints in shards, and the one-line message for a checkpoint of another family. Last the
# export, --save DIR (a directory transformers loads): save_pretrained's split, the index, F32
# and BF16 bytes, config.json against the model, one rank and 8 alike, replacing an earlier
# export, the tokenizer files, its loss from a float64 Hugging Face model of its files alone
# (hf_ref.py; numpy) and from transformers (hf_transformers.py; where installed), and its errors.
# Prints PASS/FAIL/SKIP hfload/<name> (tests/lib.sh); scratch in build/test/hfload/.
. "$(dirname "$0")/../lib.sh" hfload
SHARD=build/tools/stshard
REF=build/ref/gpt2_ref

show() { sed 's/^/  /' "$1" | head -n "${2:-20}"; }     # a log, indented, for a FAIL

# verdict NAME WHY LOG CHECK...: PASS NAME if CHECK succeeds (output to LOG), else show LOG and
# FAIL NAME: WHY.
verdict() {
    local name=$1 why=$2 log=$3
    shift 3
    if "$@" > "$log" 2>&1; then pass "$name"
    else show "$log" 30; fail "$name" "$why"; fi
}

# -- Setup --------------------------------------------------------------------------------------
if ! make -s --no-print-directory build/gen build/librt_cpu.a build/libgpt_cpu.a ref \
        build/tools/stcompare build/tools/stshard > "$S/make.log" 2>&1; then
    show "$S/make.log"
    fail setup "make build/gen librt_cpu.a libgpt_cpu.a ref stcompare stshard failed"
    finish
fi
build/gen tiny --dump config > "$S/config.json" 2>&1
get() { sed -n "s/^    \"$1\": \([0-9]*\),*$/\1/p" "$S/config.json" | head -n 1; }
L=$(get layers) C=$(get hidden) H=$(get heads) T=$(get seq_len) V=$(get vocab)
if [ -z "$L" ] || [ -z "$C" ] || [ -z "$H" ] || [ -z "$T" ] || [ -z "$V" ]; then
    show "$S/config.json"
    fail setup "cannot read the sizes of models/tiny.lua from build/gen --dump config"
    finish
fi
NTENSORS=$((4 + 12 * L))
if ! gen_build "$S/tiny" tiny; then
    fail setup "$WHY"
    finish
fi
A=$S/tiny/train
INIT=$S/init.safetensors
if ! $REF --layers "$L" --hidden "$C" --heads "$H" --seq "$T" --vocab "$V" --random-init 7 \
        --save-init "$INIT" > "$S/init.log" 2>&1; then
    show "$S/init.log"
    fail setup "gpt2_ref --save-init failed"
    finish
fi
# the checkpoints: F32 in 3 shards, BF16 in 3 shards, BF16 as one file, F32 as a directory with
# one model.safetensors
HF=$S/hf HB=$S/hf-bf16 H1=$S/hf-bf16-one HS=$S/hf-single
if ! { $SHARD --shards 3 "$INIT" "$HF" && $SHARD --shards 3 --dtype BF16 "$INIT" "$HB" &&
       $SHARD --dtype BF16 "$INIT" "$H1" && $SHARD "$INIT" "$HS"; } > "$S/shard.log" 2>&1; then
    show "$S/shard.log"
    fail setup "stshard failed"
    finish
fi
IDX=$HF/model.safetensors.index.json

# index_add INDEX NAME SHARD...: weight_map entries "NAME": "SHARD" added at the top of INDEX
index_add() {
    local f=$1
    shift
    awk -v add="$*" '{ print } /^  "weight_map": \{$/ { n = split(add, a, " ")
        for (i = 1; i < n; i += 2) printf "    \"%s\": \"%s\",\n", a[i], a[i + 1] }' "$f" \
        > "$f.new" && mv "$f.new" "$f"
}

# load NAME ARGS...: train --steps 0 ARGS --save $S/NAME.safetensors (output in $S/NAME.log)
load() {
    local name=$1
    shift
    $A --steps 0 "$@" --save "$S/$name.safetensors" > "$S/$name.log" 2>&1 ||
        { cat "$S/$name.log"; return 1; }
}
load single --init "$INIT" || { show "$S/single.log"; fail setup "the single file does not load"; }

# -- Loading ------------------------------------------------------------------------------------
sharded() {
    [ "$(ls "$HF" | wc -l)" = 4 ] || { echo "stshard did not write 3 shards + index"; return 1; }
    load sharded --init "$IDX" && cmp "$S/sharded.safetensors" "$S/single.safetensors"
}
verdict sharded-same-as-single "3 shards + index do not load bit for bit as the single file" \
    "$S/v-sharded.log" sharded
dir_index() { load dir --init "$HF/" && cmp "$S/dir.safetensors" "$S/single.safetensors"; }
verdict dir-index "a directory with model.safetensors.index.json does not load the same" \
    "$S/v-dir.log" dir_index
dir_single() { load dir1 --init "$HS" && cmp "$S/dir1.safetensors" "$S/single.safetensors"; }
verdict dir-single "a directory with one model.safetensors does not load the same" \
    "$S/v-dir1.log" dir_single
# BF16 shards: the same values as the one BF16 file, each within half a BF16 ulp of the F32
bf16() {
    load bf16 --init "$HB" && load bf16-one --init "$H1/model.safetensors" &&
    cmp "$S/bf16.safetensors" "$S/bf16-one.safetensors" &&
    ! cmp -s "$S/bf16.safetensors" "$S/single.safetensors" &&
    $STCOMPARE -q --rtol 0.00390625 --atol 0 "$S/bf16.safetensors" "$INIT"
}
verdict sharded-bf16 "BF16 shards do not load as the BF16 values of the F32 file" \
    "$S/v-bf16.log" bf16
# buffers of Hugging Face checkpoints in the index (GPT-2's masks, Llama's rotary frequencies)
# are ignored, whichever shard they are mapped to and whether or not it holds them
HX=$S/hf-buffers
cp -r "$HF" "$HX"
index_add "$HX/model.safetensors.index.json" h.0.attn.bias model-00001-of-00003.safetensors \
    h.0.attn.masked_bias model-00002-of-00003.safetensors \
    model.rotary_emb.inv_freq model-00003-of-00003.safetensors
buffers() {
    grep -E '^    "(h.0.attn.(masked_)?bias|model.rotary_emb.inv_freq)": ' \
        "$HX/model.safetensors.index.json" | wc -l | grep -qx 3 &&
    load buffers --init "$HX" && cmp "$S/buffers.safetensors" "$S/single.safetensors"
}
verdict index-buffers-ignored "an index naming Hugging Face buffers does not load" \
    "$S/v-buffers.log" buffers
# every rank reads its own pieces from the shards: TP2 PP2 DP2 loads and saves the same model
parallel() {
    gen_build "$S/tiny-tp2-pp2-dp2" tiny --tp 2 --pp 2 --dp 2 || { echo "$WHY"; return 1; }
    run_prog "$S/tiny-tp2-pp2-dp2/train" 8 "$S/par.log" --steps 0 --init "$HB" \
        --save "$S/par.safetensors" || { cat "$S/par.log"; return 1; }
    cmp "$S/par.safetensors" "$S/bf16-one.safetensors"
}
if have_mpi; then
    verdict sharded-tp2-pp2-dp2 "8 ranks do not load the BF16 shards as one rank does" \
        "$S/v-par.log" parallel
else
    skip sharded-tp2-pp2-dp2 "mpirun not found (make deps)"
fi
help_text() {
    $A --help > "$S/help.txt" &&
    grep -q -- '--init PATH .*Hugging Face checkpoint' "$S/help.txt" &&
    grep -q 'model.safetensors.index.json' "$S/help.txt"
}
verdict help-init "--help does not describe --init's file, index or directory" "$S/v-help.log" \
    help_text

# -- A file written by PyTorch (BF16, as save_pretrained lays it out, with GPT-2's buffers) ----
PY=$(torch_python)
torch_file() {
    "$PY" tests/hfload/torch_save.py "$INIT" "$S/torch.safetensors" &&
    load torch --init "$S/torch.safetensors" &&
    cmp "$S/torch.safetensors" "$S/bf16-one.safetensors"
}
if [ -z "$PY" ]; then
    skip torch-bf16 "PyTorch not installed (apt-get install python3-torch)"
else
    verdict torch-bf16 "a BF16 file written from torch tensors does not load as stshard's BF16" \
        "$S/v-torch.log" torch_file
fi

# -- Bad checkpoints: exact message (stderr, whole) and exit status 1 ---------------------------
# expect NAME MESSAGE PATH: train --steps 0 --init PATH; stderr must be MESSAGE exactly
expect() {
    local name=$1 want=$2
    $A --steps 0 --init "$3" > "$S/err-$name.out" 2> "$S/err-$name.err"
    local rc=$?
    printf '%s\n' "$want" > "$S/err-$name.want"
    if [ $rc -ne 1 ]; then
        show "$S/err-$name.err" 5
        fail "err-$name" "exit status $rc, expected 1"
    elif ! cmp -s "$S/err-$name.err" "$S/err-$name.want"; then
        diff "$S/err-$name.want" "$S/err-$name.err" | sed 's/^/  /' | head -n 10
        fail "err-$name" "the message differs (< expected, > got)"
    else
        pass "err-$name"
    fi
}
# copy DIR: a copy of the F32 shards to break ($S/bad-N), its index in $BI
n_bad=0
copy() {
    n_bad=$((n_bad + 1))
    BD=$S/bad-$n_bad
    cp -r "$HF" "$BD"
    BI=$BD/model.safetensors.index.json
}
# the shard the index maps NAME to
shard_of() { sed -n "s/^    \"$1\": \"\(.*\)\",*$/\1/p" "$IDX"; }
NOT="error: not loaded (1 problem): --init needs the $NTENSORS tensors of this model, with"
NOT="$NOT Hugging Face GPT-2 names and shapes, in F32, BF16 or F16"

copy
gone=model-00002-of-00003.safetensors
rm "$BD/$gone"
expect shard-missing "$BD/$gone: error: cannot open: No such file or directory; the index maps \
$(grep -c "\": \"$gone\"" "$IDX") tensors to this shard
$BI: $NOT" "$BI"

copy
t=h.3.ln_2.bias
own=$(shard_of $t)
other=model-00001-of-00003.safetensors
[ "$own" = $other ] && other=model-00003-of-00003.safetensors
sed -i "s/^    \"$t\": \"$own\"/    \"$t\": \"$other\"/" "$BI"
expect wrong-shard "$BI: error: tensor '$t' is mapped to '$other', which does not hold it (it \
is in '$own')
$BI: $NOT" "$BD"

copy
sed -i "/^    \"$t\": /d" "$BI"
expect not-in-index "$BI: error: tensor '$t' is in '$own' but not in the weight_map
$BI: $NOT" "$BI"

copy
index_add "$BI" h.3.ln_2.scale "$own"
expect index-extra "$BI: error: unexpected tensor 'h.3.ln_2.scale' (not a parameter of this \
model)
$BI: $NOT" "$BI"

# byte positions are offsets from the start of the index (0: its first byte)
copy
printf '{"metadata": {"total_size": 4}, "weight_map": {"wte.weight" "%s"}}\n' "$own" > "$BI"
expect index-json "$BI: error: malformed index JSON (expected ':', at byte 60)" "$BD"
printf '{"weight_map": {\n  "wte.weight": "a",\n  "ln_f.bias": "b",\n  "wte.weight": "c"\n}}' \
    > "$BI"
expect index-mapped-twice "$BI: error: malformed index JSON (tensor 'wte.weight' mapped twice, \
at byte 60)" "$BI"
printf '{"weight_map": {}} }' > "$BI"
expect index-trailing "$BI: error: malformed index JSON (text after the JSON object, at byte \
19)" "$BI"

mkdir -p "$S/empty"
touch "$S/empty/model-00001-of-00001.safetensors"
expect dir-empty "$S/empty: error: no model.safetensors.index.json or model.safetensors in \
this directory (a Hugging Face checkpoint directory holds one of them)" "$S/empty"
copy
cp "$HS/model.safetensors" "$BD/"
expect dir-both "$BD: error: this directory holds both model.safetensors.index.json and \
model.safetensors: name the one to load" "$BD"

# another architecture's names: one line naming the first tensors of both, not 100 problems
HL=$S/llama-names
$SHARD --prefix model.x. --rename wte.weight=model.embed_tokens.weight "$INIT" "$HL" \
    > "$S/llama.log" 2>&1
expect other-architecture "$HL/model.safetensors: error: this file holds Llama tensor names \
('model.embed_tokens.weight', 'model.x.wpe.weight', ...) but the model (models/tiny.lua) needs \
Hugging Face GPT-2 names ('wte.weight', 'wpe.weight', ...): convert the checkpoint or pick the \
matching model" "$HL/model.safetensors"
HL3=$S/llama-names-3
$SHARD --shards 3 --prefix model.x. --rename wte.weight=model.embed_tokens.weight "$INIT" \
    "$HL3" > "$S/llama3.log" 2>&1
expect other-architecture-sharded "$HL3/model.safetensors.index.json: error: this checkpoint \
holds Llama tensor names ('model.embed_tokens.weight', 'model.x.h.0.attn.c_attn.bias', \
...) but the model (models/tiny.lua) needs Hugging Face GPT-2 names ('wte.weight', \
'wpe.weight', ...): convert the checkpoint or pick the matching model" "$HL3"
# GPT2LMHeadModel.save_pretrained's names ('transformer.' prefix) load as the plain ones; its
# state_dict's lm_head.weight (the tied embedding's copy) loads when equal, and is refused when
# one bit differs (an untied head cannot be dropped silently)
HP=$S/prefixed
$SHARD --prefix transformer. "$INIT" "$HP" > "$S/prefixed.log" 2>&1
prefixed() { load prefixed --init "$HP" && cmp "$S/prefixed.safetensors" "$S/single.safetensors"; }
verdict gpt2-prefixed "names with GPT2LMHeadModel's 'transformer.' prefix do not load as the \
plain ones" "$S/v-prefixed.log" prefixed
head_copy() {
    python3 tests/hfload/hf_check.py head "$HP/model.safetensors" "$S/head-in.safetensors" -1 &&
    load head --init "$S/head-in.safetensors" && cmp "$S/head.safetensors" "$S/single.safetensors"
}
verdict tied-head-copy "a checkpoint with lm_head.weight equal to the embedding does not load" \
    "$S/v-head.log" head_copy
python3 tests/hfload/hf_check.py head "$HP/model.safetensors" "$S/head-bad.safetensors" 70 \
    > "$S/head-bad.log" 2>&1
expect tied-head-differs "$S/head-bad.safetensors: error: tensor 'lm_head.weight' differs from \
'transformer.wte.weight' at element 70 (row 1, column $((70 - C)): \
$(python3 tests/hfload/hf_check.py value "$S/head-bad.safetensors" lm_head.weight 70), not \
$(python3 tests/hfload/hf_check.py value "$S/head-bad.safetensors" transformer.wte.weight 70)): \
the model (models/tiny.lua) ties its LM head to the embedding, so a checkpoint may hold the head \
only as the embedding's copy" "$S/head-bad.safetensors"

# -- Llama and Mixtral names (models/tiny_llama.lua, models/tiny_mixtral.lua) ------------------
# Each model's own random initialisation, saved, rewritten as 3 shards + index (with Llama's
# rotary buffers named in the index), loads bit for bit; a checkpoint of another family fails
# in one line.
declare -A PROG
for m in tiny_llama tiny_mixtral; do
    if [ ! -f "models/$m.lua" ]; then
        skip "$m-sharded" "models/$m.lua is not there"
        continue
    fi
    if ! gen_build "$S/$m" "$m"; then
        fail "$m-sharded" "$WHY"
        continue
    fi
    PROG[$m]=$S/$m/train
    family_sharded() {
        "${PROG[$m]}" --steps 0 --save "$S/$m-init.safetensors" &&
        $SHARD --shards 3 "$S/$m-init.safetensors" "$S/$m-hf" &&
        index_add "$S/$m-hf/model.safetensors.index.json" \
            model.layers.0.self_attn.rotary_emb.inv_freq model-00001-of-00003.safetensors &&
        "${PROG[$m]}" --steps 0 --init "$S/$m-hf" --save "$S/$m-loaded.safetensors" &&
        cmp "$S/$m-loaded.safetensors" "$S/$m-init.safetensors"
    }
    verdict "$m-sharded" "$m's checkpoint in 3 shards + index does not load bit for bit" \
        "$S/v-$m.log" family_sharded
done
# expect_prog PROG NAME MESSAGE PATH: as expect, with another model's program
expect_prog() { local A=$1; shift; expect "$@"; }
if [ -n "${PROG[tiny_llama]}" ]; then
    expect_prog "${PROG[tiny_llama]}" llama-given-gpt2 "$INIT: error: this file holds GPT-2 \
tensor names ('wte.weight', 'wpe.weight', ...) but the model (models/tiny_llama.lua) needs \
Hugging Face Llama names ('model.embed_tokens.weight', 'model.layers.0.input_layernorm.weight', \
...): convert the checkpoint or pick the matching model" "$INIT"
fi
if [ -n "${PROG[tiny_mixtral]}" ] && [ -f "$S/tiny_llama-hf/model.safetensors.index.json" ]; then
    expect_prog "${PROG[tiny_mixtral]}" mixtral-given-llama "$S/tiny_llama-hf/\
model.safetensors.index.json: error: this checkpoint holds Llama tensor names \
('lm_head.weight', 'model.embed_tokens.weight', ...) but the model (models/tiny_mixtral.lua) \
needs Hugging Face Mixtral names ('model.embed_tokens.weight', \
'model.layers.0.input_layernorm.weight', ...): convert the checkpoint or pick the matching \
model" "$S/tiny_llama-hf"
fi

# -- Export: --save DIR, a directory transformers loads ------------------------------------------
# Each export is checked by what it must be, computed apart from the program: hf_check.py
# (save_pretrained's split, the index, every tensor's bytes, BF16 rounded to nearest even by its
# own code; config.json's every field against the generator's resolved model), --init DIR
# loading it back bit for bit, and hf_ref.py (a float64 implementation of the Hugging Face
# model from config.json and the safetensors alone) agreeing with the program's first-step loss
# on the same tokens; transformers itself where it is installed.
# numpy_python: the first of python3, /usr/bin/python3 that imports numpy (empty if none)
numpy_python() {
    local p
    for p in python3 /usr/bin/python3; do
        if "$p" -c 'import numpy' > /dev/null 2>&1; then echo "$p"; return; fi
    done
}
# hf_python: the first python that imports torch and transformers (empty if none)
hf_python() {
    local p
    for p in python3 /usr/bin/python3; do
        if "$p" -c 'import torch, transformers' > /dev/null 2>&1; then echo "$p"; return; fi
    done
}
NPY=$(numpy_python)
HFPY=$(hf_python)
TOKS=$S/tokens.bin
build/ref/make_tokens --vocab "$V" --tokens 20000 --seed 5 "$TOKS" > /dev/null
CHECK="python3 tests/hfload/hf_check.py"

# export NAME PROG ARGS...: PROG --steps 0 ARGS --save $S/NAME (a directory; log $S/NAME.log)
export_dir() {
    local name=$1 prog=$2
    shift 2
    rm -rf "${S:?}/$name"
    "$prog" --steps 0 "$@" --save "$S/$name" > "$S/$name.log" 2>&1 || { cat "$S/$name.log"; return 1; }
}
# same_loss NAME PROG DIR: PROG's first-step loss from --init DIR (learning rate 0) and hf_ref's
# from DIR's files agree within 1e-5 relative (float32 against float64); then transformers'
# where installed (verdict NAME-transformers)
same_loss() {
    local name=$1 prog=$2 dir=$3 gbs seq ours ref
    if [ -z "$NPY" ]; then
        skip "$name" "numpy not installed (make deps: python3-numpy)"
        return
    fi
    "$prog" --init "$dir" --steps 1 --lr 0 --data "$TOKS" --log "$S/$name.jsonl" \
        > "$S/$name.log" 2>&1 || { show "$S/$name.log"; fail "$name" "--init $dir does not train"; return; }
    gbs=$(sed -n 's/.*global batch \([0-9]*\) sequences.*/\1/p' "$S/$name.log")
    seq=$(sed -n 's/.*global batch .* of \([0-9]*\) tokens,.*/\1/p' "$S/$name.log")
    ours=$(sed -n 's/.*"loss":\([^,]*\),.*/\1/p' "$S/$name.jsonl")
    ref=$("$NPY" tests/hfload/hf_ref.py "$dir" "$TOKS" "$gbs" "$seq" 2> "$S/$name.ref.err")
    if [ -z "$ref" ] || [ -z "$ours" ]; then
        show "$S/$name.ref.err"
        fail "$name" "no loss from the program ('$ours') or from hf_ref.py ('$ref')"
    elif awk -v a="$ours" -v b="$ref" 'BEGIN { d = a - b; if (d < 0) d = -d; exit d > 1e-5 * b }'
    then
        pass "$name"
    else
        fail "$name" "the program's loss $ours, the float64 Hugging Face model's $ref"
    fi
    if [ -z "$HFPY" ]; then
        skip "$name-transformers" "torch and transformers not installed (the GPU machines have them)"
    else
        verdict "$name-transformers" "transformers does not load $dir as the program's model" \
            "$S/$name.tf.log" "$HFPY" tests/hfload/hf_transformers.py "$dir" "$TOKS" "$gbs" \
            "$seq" "$ours"
    fi
}

# F32 past a 40 KB limit: the 64 KB tensors get files of their own, the others share
ex_f32() {
    export_dir ex-f32 "$A" --init "$INIT" --save-shard-size 40KB &&
    $CHECK shards "$S/single.safetensors" "$S/ex-f32" 40000 F32 &&
    load ex-f32-back --init "$S/ex-f32" && cmp "$S/ex-f32-back.safetensors" "$S/single.safetensors"
}
verdict export-f32-sharded "the F32 export in 40 KB shards is not save_pretrained's split of the \
model, or does not load back bit for bit" "$S/v-ex-f32.log" ex_f32
ex_bf16() {
    export_dir ex-bf16 "$A" --init "$INIT" --save-dtype bf16 --save-shard-size 0.1MB &&
    $CHECK shards "$S/single.safetensors" "$S/ex-bf16" 100000 BF16 &&
    load ex-bf16-back --init "$S/ex-bf16" &&
    cmp "$S/ex-bf16-back.safetensors" "$S/bf16-one.safetensors" &&
    "$A" --steps 0 --init "$INIT" --save-dtype bf16 --save "$S/ex-bf16-file.safetensors" &&
    grep -q '"dtype":"BF16"' "$S/ex-bf16-file.safetensors" &&
    ! grep -q '"dtype":"F32"' "$S/ex-bf16-file.safetensors" &&
    load ex-bf16-file-back --init "$S/ex-bf16-file.safetensors" &&
    cmp "$S/ex-bf16-file-back.safetensors" "$S/bf16-one.safetensors"
}
verdict export-bf16 "the BF16 export (a directory, or one file) is not the model rounded to \
nearest even in save_pretrained's split, or does not load back as those values" \
    "$S/v-ex-bf16.log" ex_bf16
ex_one() {
    export_dir ex-one "$A" --init "$INIT" && $CHECK shards "$S/single.safetensors" "$S/ex-one" \
        5000000000 F32 && $CHECK config "$S/config.json" "$S/ex-one" float32
}
verdict export-gpt2-config "below the default 5GB limit the export is not one \
model.safetensors with a GPT2Config of models/tiny.lua" "$S/v-ex-one.log" ex_one
# 8 ranks (TP2 PP2 DP2) write the same directory as one rank, byte for byte
ex_par() {
    rm -rf "$S/ex-par"
    run_prog "$S/tiny-tp2-pp2-dp2/train" 8 "$S/ex-par.log" --steps 0 --init "$INIT" \
        --save "$S/ex-par" --save-dtype bf16 --save-shard-size 100000 ||
        { cat "$S/ex-par.log"; return 1; }
    diff -r "$S/ex-par" "$S/ex-bf16"
}
if have_mpi && [ -x "$S/tiny-tp2-pp2-dp2/train" ]; then
    verdict export-tp2-pp2-dp2 "8 ranks do not export the directory one rank does" \
        "$S/v-ex-par.log" ex_par
else
    skip export-tp2-pp2-dp2 "mpirun or the TP2 PP2 DP2 program is not there"
fi
# an earlier export is replaced whole (its shards gone; DIR/ is DIR); the tokenizer's files are
# copied
# (hf_check.py's: bos '<s>' id 3 among the added tokens, eos id 5 in the vocabulary), and its
# bos and eos ids are config.json's and generation_config.json's
TK=$S/tokenizer
$CHECK tokenizer "$TK" 5
ex_replace() {
    cp -r "$S/ex-f32" "$S/ex-again"
    "$A" --steps 0 --init "$INIT" --save "$S/ex-again/" --tokenizer "$TK" > "$S/ex-again.log" \
        2>&1 || { cat "$S/ex-again.log"; return 1; }
    [ "$(ls "$S/ex-again" | tr '\n' ' ')" = "config.json generation_config.json \
model.safetensors special_tokens_map.json tokenizer.json tokenizer_config.json " ] &&
    [ ! -e "$S/ex-again.tmp" ] && [ ! -e "$S/ex-again.old" ] &&
    for f in tokenizer.json tokenizer_config.json special_tokens_map.json; do
        cmp "$TK/$f" "$S/ex-again/$f" || return 1
    done &&
    cmp "$S/ex-again/model.safetensors" "$S/ex-one/model.safetensors" &&
    $CHECK config "$S/config.json" "$S/ex-again" float32 3 5
}
verdict export-replace-tokenizer "an export over an earlier one does not replace it whole, or \
the tokenizer files are not copied" "$S/v-ex-again.log" ex_replace
same_loss export-gpt2-loss "$A" "$S/ex-f32"

for m in tiny_llama tiny_mixtral; do
    [ -n "${PROG[$m]}" ] || continue
    build/gen "$m" --dump config > "$S/$m-config.json" 2>&1
    family_export() {
        export_dir "ex-$m" "${PROG[$m]}" --init "$S/$m-init.safetensors" --save-dtype bf16 \
            --save-shard-size 150KB &&
        $CHECK shards "$S/$m-init.safetensors" "$S/ex-$m" 150000 BF16 &&
        $CHECK config "$S/$m-config.json" "$S/ex-$m" bfloat16 &&
        "${PROG[$m]}" --steps 0 --init "$S/ex-$m" --save "$S/ex-$m-back.safetensors" &&
        "$SHARD" --dtype BF16 "$S/$m-init.safetensors" "$S/$m-bf16" &&
        "${PROG[$m]}" --steps 0 --init "$S/$m-bf16" --save "$S/$m-bf16-back.safetensors" &&
        cmp "$S/ex-$m-back.safetensors" "$S/$m-bf16-back.safetensors"
    }
    verdict "export-$m" "$m's BF16 export is not its model in save_pretrained's split with its \
config, or does not load back" "$S/v-ex-$m.log" family_export
    same_loss "export-$m-loss" "${PROG[$m]}" "$S/ex-$m"
done

# -- Export errors: usage (status 2) and outputs checked before training (status 1) -------------
# expect_run NAME STATUS MESSAGE ARGS...: train ARGS exits STATUS with stderr MESSAGE exactly
expect_run() {
    local name=$1 status=$2 want=$3
    shift 3
    $A "$@" > "$S/err-$name.out" 2> "$S/err-$name.err"
    local rc=$?
    printf '%s\n' "$want" > "$S/err-$name.want"
    if [ $rc -ne "$status" ]; then
        show "$S/err-$name.err" 5
        fail "err-$name" "exit status $rc, expected $status"
    elif ! cmp -s "$S/err-$name.err" "$S/err-$name.want"; then
        diff "$S/err-$name.want" "$S/err-$name.err" | sed 's/^/  /' | head -n 10
        fail "err-$name" "the message differs (< expected, > got)"
    else
        pass "err-$name"
    fi
}
BEFORE="; checked before training, nothing was run"
expect_run save-dtype 2 "train: error: --save-dtype must be f32 or bf16, got 'fp16'" \
    --steps 0 --save "$S/x" --save-dtype fp16
SIZE_WANT="expects a size of at least 1 byte: bytes, or a number with KB, MB, GB, TB (powers of \
1000) or KiB, MiB, GiB, TiB, as Hugging Face's max_shard_size (\"5GB\")"
expect_run shard-size-0 2 "train: error: --save-shard-size $SIZE_WANT; got '0'" \
    --steps 0 --save "$S/x" --save-shard-size 0
expect_run shard-size-word 2 "train: error: --save-shard-size $SIZE_WANT; got '5 gigabytes'" \
    --steps 0 --save "$S/x" --save-shard-size "5 gigabytes"
expect_run shard-size-file 1 "$S/x.safetensors: error: --save-shard-size is about --save DIR (a \
Hugging Face directory), and this --save names one .safetensors file$BEFORE" \
    --steps 0 --save "$S/x.safetensors" --save-shard-size 1GB
touch "$S/a-file"
expect_run save-dir-unwritable 1 "$S/a-file/model: error: cannot create its directory: Not a \
directory (--save)$BEFORE" --steps 0 --save "$S/a-file/model"
# a directory holding anything an export does not write is refused and left as it was
mkdir -p "$S/user-dir"
echo notes > "$S/user-dir/notes.txt"
expect_run save-dir-foreign 1 "$S/user-dir: error: holds 'notes.txt', which an export does not \
write: --save DIR replaces a directory only when it holds a Hugging Face export's files alone; \
remove it or name another directory$BEFORE" --steps 0 --save "$S/user-dir"
untouched() {
    [ "$(ls "$S/user-dir")" = notes.txt ] && [ ! -e "$S/user-dir.tmp" ] &&
    [ ! -e "$S/x" ] && [ ! -e "$S/x.tmp" ] && [ ! -e "$S/a-file.tmp" ]
}
verdict save-dir-left-alone "a refused --save left something behind" "$S/v-untouched.log" untouched
mkdir -p "$S/no-tokenizer"
expect_run tokenizer-missing 1 "$S/no-tokenizer: error: holds no tokenizer.json (--tokenizer \
takes a Hugging Face tokenizer.json or a directory holding one)$BEFORE" --steps 0 \
    --save "$S/x" --tokenizer "$S/no-tokenizer"
expect_run tokenizer-not-json 1 "$S/tokens.bin: error: is not a JSON object (--tokenizer takes \
a Hugging Face tokenizer.json, a JSON object, or a directory holding one)$BEFORE" --steps 0 \
    --save "$S/x" --tokenizer "$TOKS"
$CHECK tokenizer "$S/tokenizer-big" "$V"
expect_run tokenizer-vocab 1 "$S/tokenizer-big: error: its eos_token 'end☃' is id $V, outside \
the model's vocabulary of $V: --tokenizer must be the model's own tokenizer$BEFORE" --steps 0 \
    --save "$S/x" --tokenizer "$S/tokenizer-big"
expect_run tokenizer-no-save 2 "train: error: --tokenizer is about --save, which is not given" \
    --steps 0 --tokenizer "$TK"
# a model Hugging Face has no architecture for: refused before training (one file still works)
if [ ! -f models/tiny_moe.lua ]; then
    skip err-no-architecture "models/tiny_moe.lua is not there"
elif ! gen_build "$S/tiny_moe" tiny_moe; then
    fail err-no-architecture "$WHY"
else
    A=$S/tiny_moe/train expect_run no-architecture 1 "models/tiny_moe.lua: error: --save DIR \
writes a Hugging Face model directory, and a GPT model with a mixture of experts has no Hugging \
Face architecture; write one file with --save FILE.safetensors$BEFORE" --steps 0 --save "$S/x"
fi

finish
