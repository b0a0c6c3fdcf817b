#!/usr/bin/env python3
# tests/fuzz/seeds.py: writes the seed corpora tests/fuzz/corpus/<harness>/ (run from the
# repository root; the files are committed, so this only documents and remakes them). Seeds
# are small valid and nearly valid inputs, taken from the repository's own files where there
# are some: templates from tests/tmpl/cases, models/tiny*.lua, command lines of tests/errors.
import glob, json, os, shutil, struct

OUT = "tests/fuzz/corpus"

def put(harness, name, data):
    os.makedirs(f"{OUT}/{harness}", exist_ok=True)
    with open(f"{OUT}/{harness}/{name}", "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)

def argv(*words):
    return "\0".join(words)

# templates: the small cases of the template tests, for the lexer and the compiler
for path in sorted(glob.glob("tests/tmpl/cases/*.tmpl")):
    if os.path.getsize(path) <= 400:
        data = open(path, "rb").read()
        for h in ("tmpl_lex", "tmpl_parse"):
            put(h, os.path.basename(path), data)
for h in ("tmpl_lex", "tmpl_parse"):
    put(h, "model.h.tmpl", open("templates/program/model.h.tmpl", "rb").read())

# model descriptions: the tiny models and a few near misses
for path in sorted(glob.glob("models/tiny*.lua")):
    put("model", os.path.basename(path), open(path, "rb").read())
tiny = open("models/tiny.lua").read()
put("model", "heads_divide.lua", tiny.replace("heads   = 4", "heads   = 5"))
put("model", "loop.lua", "local n = 0\nwhile true do n = n + 1 end\n")
put("model", "string_rep.lua", "local s = ('x'):rep(1 << 20)\nreturn gpt { layers = #s }\n")
put("model", "metatable.lua", "return gpt(setmetatable({}, { __index = function() "
    "return 1 end }))\n")

# the generator's command line: a few of tests/errors/*.cmd and the everyday ones
for path in sorted(glob.glob("tests/errors/*.cmd"))[:8]:
    put("gen_cli", os.path.basename(path), argv(*open(path).read().split()))
put("gen_cli", "everyday", argv("gpt2_124m", "--tp", "4", "--dp=2", "--sp", "--dump", "config"))
put("gen_cli", "lua", argv("--driver", "x.lua", "--inspect", "--rank", "3", "--", "-tiny"))

# the training program's command line
put("flags", "data", argv("--data", "data/corpus.bin", "--steps", "20", "--lr", "1e-3"))
put("flags", "wsd", argv("--data", "x", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters",
                         "5", "--lr-wsd-decay-style", "cosine", "--decay-steps", "10"))
put("flags", "blend", argv("--data-path", "0.3", "a", "0.7", "b", "--data-seed", "7",
                           "--steps", "3"))
put("flags", "faults", argv("--data", "x", "--ckpt-dir", "c", "--exit-signal", "TERM,SIGUSR2",
                            "--exit-grace", "30", "--exit-interval", "100",
                            "--skip-bad-steps", "2", "--resume"))
put("flags", "bad", argv("--steps", "-1", "--beta1", "1"))

# safetensors files and a Hugging Face index
def safetensors(tensors, meta=True, pad=True):
    header, data = {}, b""
    if meta:
        header["__metadata__"] = {"format": "pt"}
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data

f32 = struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, -7)
bf16 = struct.pack("<4H", 0x3f80, 0xbf80, 0x7f80, 0x0001)
f16 = struct.pack("<4H", 0x3c00, 0x7c00, 0x0001, 0x7e00)
put("safetensors", "f32.safetensors", safetensors([("wte", "F32", [2, 3], f32)]))
put("safetensors", "mixed.safetensors", safetensors(
    [("a.bf16", "BF16", [4], bf16), ("b.f16", "F16", [2, 2], f16),
     ("c.i64", "I64", [1], struct.pack("<q", -5)), ("d.scalar", "F32", [], f32[:4])]))
put("safetensors", "nometa.safetensors", safetensors([("x", "F32", [1, 1], f32[:4])],
                                                     meta=False, pad=False))
put("safetensors", "short.safetensors", safetensors([("x", "F32", [3], f32[:8])]))
put("safetensors", "index.json", json.dumps(
    {"metadata": {"total_size": 40}, "weight_map": {"wte": "model-00001-of-00002.safetensors",
     "h.0.w": "model-00002-of-00002.safetensors", "h.1.w": "model-00001-of-00002.safetensors"}},
    indent=2))

# token files: nanoGPT's uint16 .bin (the start of data/corpus.bin) and an llm.c shard
put("tokens", "nanogpt.bin", open("data/corpus.bin", "rb").read()[:256])
toks = struct.pack("<40H", *range(40))
put("tokens", "llmc.bin", struct.pack("<256i", 20240520, 1, 40, *([0] * 253)) + toks)
put("tokens", "odd.bin", b"\x01\x02\x03")
put("tokens", "llmc_v2.bin", struct.pack("<256i", 20240520, 2, 40, *([0] * 253)) + toks)

# Megatron datasets: options byte, idx length, PREFIX.idx, PREFIX.bin (fuzz_megatron.c)
def megatron(opt, code, lens, fmt, tokens, magic=b"MMIDIDX\0\0"):
    width = struct.calcsize("<" + fmt)
    ptrs, at = [], 0
    for n in lens:
        ptrs.append(at)
        at += n * width
    idx = magic + struct.pack("<QBQQ", 1, code, len(lens), len(lens) + 1)
    idx += struct.pack(f"<{len(lens)}i", *lens) + struct.pack(f"<{len(lens)}q", *ptrs)
    idx += struct.pack(f"<{len(lens) + 1}q", *range(len(lens) + 1))
    binary = struct.pack(f"<{len(tokens)}{fmt}", *tokens)
    return bytes([opt]) + struct.pack("<I", len(idx)) + idx + binary

toks = [(7 * i) % 300 for i in range(60)]
put("megatron", "uint16", megatron(0x22, 8, [10, 25, 5, 20], "H", toks))
put("megatron", "int32_blend", megatron(0x35, 4, [30, 30], "i", toks))
put("megatron", "uint8_many_epochs", megatron(0xf0, 1, [3, 1, 2], "B", toks[:6]))
put("megatron", "int64", megatron(0x12, 5, [6, 6], "q", toks[:12]))
put("megatron", "empty_doc", megatron(0x44, 3, [0, 12, 0], "h", toks[:12]))
put("megatron", "bad_magic", megatron(0x02, 8, [4], "H", toks[:4], magic=b"XXIDIDX\0\0"))
