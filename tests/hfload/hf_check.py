"""tests/hfload/hf_check.py: checks of a --save DIR export against what it must hold, each
computed here from its own inputs (python3 alone, no numpy):

    hf_check.py config DUMP DIR DTYPE [BOS EOS]
        config.json's every field against the model as the generator resolved it (DUMP: the
        JSON of `build/gen MODEL --dump config`), torch_dtype DTYPE (float32, bfloat16), the
        token ids BOS and EOS (null when not given), and generation_config.json's.
    hf_check.py shards SINGLE DIR LIMIT DTYPE
        the safetensors files of DIR against SINGLE (the model saved as one F32 file):
        save_pretrained's split at LIMIT bytes (file names, which tensors each holds, in
        order), the index (sorted weight_map, metadata.total_size), and every tensor's bytes:
        SINGLE's (F32), or SINGLE's rounded to nearest even (BF16).
    hf_check.py tokenizer DIR EOS
        a fixture: a tokenizer in DIR whose bos is id 3 and eos id EOS.
    hf_check.py value FILE NAME I
        prints element I of the F32 tensor NAME of FILE as C's %.9g.
    hf_check.py head IN OUT FLIP
        a fixture: IN with lm_head.weight added as a copy of its GPT-2 embedding (element FLIP
        changed in its last bit when FLIP >= 0).

Prints what differs and exits 1; exits 0 when everything holds.
"""
import json
import os
import struct
import sys

problems = []


def check(cond, what):
    if not cond:
        problems.append(what)


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
        return h, 8 + n


def tensors(path):
    """[(name, dtype, shape, bytes)] in data order."""
    h, base = header(path)
    with open(path, "rb") as f:
        raw = f.read()
    out = [(k, v["dtype"], v["shape"], raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
           for k, v in h.items() if k != "__metadata__"]
    out.sort(key=lambda t: h[t[0]]["data_offsets"][0])
    check(h.get("__metadata__", {}).get("format") == "pt", "%s: no metadata format pt" % path)
    return out


def bf16(data):
    """F32 bytes rounded to BF16, nearest even (torch's .to(torch.bfloat16))."""
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", data):
        if (u & 0x7fffffff) > 0x7f800000:
            h = (u >> 16) | 0x40
        else:
            lower, h = u & 0xffff, u >> 16
            if lower > 0x8000 or (lower == 0x8000 and h & 1):
                h += 1
        out += struct.pack("<H", h & 0xffff)
    return bytes(out)


def shards(single, d, limit, dtype):
    ref = tensors(single)
    size = {"F32": 4, "BF16": 2}[dtype]
    # save_pretrained's rule (huggingface_hub's split_torch_state_dict_into_shards): tensors
    # in order; one above the limit is a shard of its own, listed at once; one that would
    # overflow the shard being filled lists that shard and starts another; the last is listed
    # at the end. Shards are numbered in the order listed.
    files, cur, used = [], [], 0
    for name, _, shape, data in ref:
        nbytes = len(data) // 4 * size
        if nbytes > limit:
            files.append([name])
            continue
        if used + nbytes > limit:
            files.append(cur)
            cur, used = [], 0
        cur.append(name)
        used += nbytes
    if cur:
        files.append(cur)
    n = len(files)
    names = ["model.safetensors"] if n == 1 else \
        ["model-%05d-of-%05d.safetensors" % (k + 1, n) for k in range(n)]
    st = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    check(st == sorted(names), "files %s, expected %s" % (st, names))
    index = os.path.join(d, "model.safetensors.index.json")
    check(os.path.exists(index) == (n > 1), "index present: %s, shards %d" %
          (os.path.exists(index), n))
    want = {name: data for name, _, _, data in ref}
    shapes = {name: shape for name, _, shape, _ in ref}
    if n > 1 and os.path.exists(index):
        with open(index) as f:
            text = f.read()
        ix = json.loads(text)
        wm = ix["weight_map"]
        check(list(wm) == sorted(wm), "weight_map not sorted by name")
        check(ix["metadata"]["total_size"] == sum(len(v) // 4 * size for v in want.values()),
              "total_size %s" % ix["metadata"]["total_size"])
        for k, group in enumerate(files):
            for name in group:
                check(wm.get(name) == names[k], "%s mapped to %s, expected %s" %
                      (name, wm.get(name), names[k]))
        check(len(wm) == len(want), "weight_map has %d names, expected %d" % (len(wm), len(want)))
    for k, group in enumerate(files):
        path = os.path.join(d, names[k])
        if not os.path.exists(path):
            continue
        got = tensors(path)
        check([g[0] for g in got] == group, "%s holds %s, expected %s" %
              (names[k], [g[0] for g in got], group))
        for name, dt, shape, data in got:
            check(dt == dtype, "%s: dtype %s" % (name, dt))
            check(shape == shapes.get(name), "%s: shape %s" % (name, shape))
            exp = want.get(name, b"")
            check(data == (exp if dtype == "F32" else bf16(exp)), "%s: values differ" % name)


def config(dump, d, dtype, bos=None, eos=None):
    with open(dump) as f:
        m = json.load(f)["model"]
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    moe = m.get("moe")
    common = {"vocab_size": m["vocab"], "torch_dtype": dtype, "bos_token_id": bos,
              "eos_token_id": eos, "tie_word_embeddings": m["tie_embeddings"],
              "initializer_range": m["init_std"], "use_cache": True}
    if m["arch"] == "gpt":
        want = dict(common, architectures=["GPT2LMHeadModel"], model_type="gpt2",
                    n_layer=m["layers"], n_embd=m["hidden"], n_head=m["heads"],
                    n_inner=m["ffn_hidden"], n_positions=m["seq_len"], n_ctx=m["seq_len"],
                    layer_norm_epsilon=m["norm_eps"], activation_function="gelu_new",
                    attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0, scale_attn_weights=True,
                    scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False)
    else:
        want = dict(common, num_hidden_layers=m["layers"], hidden_size=m["hidden"],
                    num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"],
                    head_dim=m["head_dim"], max_position_embeddings=m["seq_len"],
                    rms_norm_eps=m["norm_eps"], rope_theta=m["rope_theta"], hidden_act="silu",
                    attention_dropout=0.0)
        if moe:
            want.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                        intermediate_size=moe["ffn_hidden"], num_local_experts=moe["experts"],
                        num_experts_per_tok=moe["top_k"],
                        router_aux_loss_coef=moe["aux_loss_coeff"], router_jitter_noise=0.0,
                        output_router_logits=False, sliding_window=None)
        else:
            want.update(architectures=["LlamaForCausalLM"], model_type="llama",
                        intermediate_size=m["ffn_hidden"], attention_bias=False,
                        mlp_bias=False, pretraining_tp=1, rope_scaling=None)
    for k, v in want.items():
        got = c.get(k, "(absent)")
        same = got is v if isinstance(v, bool) or v is None else \
            got == v and not isinstance(got, bool)
        check(same, "config.json %s = %r, expected %r" % (k, got, v))
    for k in c:
        check(k in want, "config.json has %s, which this check does not know" % k)
    check(list(c) == sorted(c), "config.json keys not sorted")
    with open(os.path.join(d, "generation_config.json")) as f:
        g = json.load(f)
    want = {"max_length": m["seq_len"]}
    want.update({k: v for k, v in (("bos_token_id", bos), ("eos_token_id", eos)) if v is not None})
    check(g == want, "generation_config.json %r, expected %r" % (g, want))


def add_head(src, dst, flip):
    """dst: src's tensors and lm_head.weight, a copy of the embedding (GPT2LMHeadModel's
    state_dict holds both), with bit 0 of element 'flip' changed if flip >= 0."""
    ts = tensors(src)
    emb = [t for t in ts if t[0] in ("wte.weight", "transformer.wte.weight")][0]
    data = bytearray(emb[3])
    if flip >= 0:
        data[4 * flip] ^= 1
    ts.append(("lm_head.weight", emb[1], emb[2], bytes(data)))
    h, blob = {"__metadata__": {"format": "pt"}}, b""
    for name, dt, shape, d in ts:
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(blob), len(blob) + len(d)]}
        blob += d
    j = json.dumps(h).encode()
    j += b" " * (-len(j) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(j)) + j + blob)


def tokenizer(d, eos_id):
    """A tokenizer.json and tokenizer_config.json in d: bos '<s>' (id 3, an added token, named
    as an object), eos 'end\u2603' (id eos_id, in the model's vocab, escaped in the JSON)."""
    os.makedirs(d, exist_ok=True)
    tok = {"version": "1.0", "added_tokens": [{"id": 7, "content": "x", "special": True},
                                              {"special": True, "content": "<s>", "id": 3}],
           "model": {"type": "BPE", "vocab": {"a": 0, "\u00e9t\u00e9": 1, "end\u2603": eos_id},
                     "merges": []}}
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f, indent=2)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False},
                   "eos_token": "end\u2603"}, f, ensure_ascii=False)
    with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "end\u2603"}, f)


def main():
    if sys.argv[1] == "tokenizer":
        tokenizer(sys.argv[2], int(sys.argv[3]))
        return
    if sys.argv[1] == "config":
        ids = [int(x) for x in sys.argv[5:7]] + [None, None]
        config(sys.argv[2], sys.argv[3], sys.argv[4], ids[0], ids[1])
    elif sys.argv[1] == "value":
        data = [t for t in tensors(sys.argv[2]) if t[0] == sys.argv[3]][0][3]
        print("%.9g" % struct.unpack_from("<f", data, 4 * int(sys.argv[4]))[0])
        return
    elif sys.argv[1] == "head":
        add_head(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        shards(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    for p in problems[:20]:
        print(p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
