"""tests/hfload/hf_ref.py: an independent float64 implementation of the Hugging Face models an
export holds (GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM), read from the export's
files alone: config.json for every size and constant, the safetensors files (one
model.safetensors, or the shards model.safetensors.index.json names; F32 or BF16) for the
weights. Written from transformers' documented model definitions, not from our C code.

    python3 hf_ref.py DIR TOKENS GBS T

prints the mean cross-entropy of the first GBS samples of the token file TOKENS (uint16, or an
llm.c shard), sample j being tokens[j*T : j*T+T+1] (inputs, then targets shifted by one), as
the training program's first step computes it. Exit 1 with a message when a file is wrong.
"""
import json
import os
import struct
import sys

import numpy as np


def read_file(path, out):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    base = 8 + hlen
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        buf = raw[base + b:base + e]
        if info["dtype"] == "F32":
            v = np.frombuffer(buf, dtype="<f4").astype(np.float64)
        elif info["dtype"] == "BF16":
            v = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            v = v.astype(np.float64)
        else:
            sys.exit("%s: tensor %s has dtype %s" % (path, name, info["dtype"]))
        out[name] = v.reshape(info["shape"])


def read_weights(d):
    w = {}
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        for s in shards:
            read_file(os.path.join(d, s), w)
    else:
        read_file(os.path.join(d, "model.safetensors"), w)
    return w


def read_tokens(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) >= 1024 and struct.unpack("<i", raw[:4])[0] == 20240520:
        n = struct.unpack("<i", raw[8:12])[0]
        raw = raw[1024:1024 + 2 * n]
    return np.frombuffer(raw, dtype="<u2").astype(np.int64)


def softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def attention(q, k, v):
    """q (H, T, D), k and v (H, T, D): causal softmax(q k^T / sqrt(D)) v."""
    T, D = q.shape[1], q.shape[2]
    s = q @ k.transpose(0, 2, 1) / np.sqrt(D)
    s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
    return softmax(s) @ v


def layer_norm(x, g, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def gpt2_logits(cfg, w, ids):
    # GPT2LMHeadModel's names carry "transformer."; GPT2Model's (and the hub's gpt2) do not
    p = "transformer." if "transformer.wte.weight" in w else ""
    T = len(ids)
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    assert cfg["activation_function"] == "gelu_new" and cfg["scale_attn_weights"]
    x = w[p + "wte.weight"][ids] + w[p + "wpe.weight"][np.arange(T)]
    for i in range(cfg["n_layer"]):
        L = "%sh.%d." % (p, i)
        h = layer_norm(x, w[L + "ln_1.weight"], w[L + "ln_1.bias"], eps)
        qkv = h @ w[L + "attn.c_attn.weight"] + w[L + "attn.c_attn.bias"]      # Conv1D: x W
        q, k, v = (qkv[:, j * C:(j + 1) * C].reshape(T, H, C // H).transpose(1, 0, 2)
                   for j in range(3))
        y = attention(q, k, v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ w[L + "attn.c_proj.weight"] + w[L + "attn.c_proj.bias"]
        h = layer_norm(x, w[L + "ln_2.weight"], w[L + "ln_2.bias"], eps)
        h = gelu_new(h @ w[L + "mlp.c_fc.weight"] + w[L + "mlp.c_fc.bias"])
        x = x + h @ w[L + "mlp.c_proj.weight"] + w[L + "mlp.c_proj.bias"]
    x = layer_norm(x, w[p + "ln_f.weight"], w[p + "ln_f.bias"], eps)
    head = w["lm_head.weight"] if not cfg["tie_word_embeddings"] else w[p + "wte.weight"]
    return x @ head.T


def rms_norm(x, g, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope(x, theta):
    """x (H, T, D) rotated as transformers' Llama: halves (x1, x2), rotate_half = (-x2, x1)."""
    H, T, D = x.shape
    inv = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    f = np.outer(np.arange(T, dtype=np.float64), inv)
    cos, sin = np.cos(np.concatenate([f, f], -1)), np.sin(np.concatenate([f, f], -1))
    rot = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos + rot * sin


def llama_logits(cfg, w, ids):
    T = len(ids)
    C, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or C // H
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    assert cfg["hidden_act"] == "silu" and not cfg.get("rope_scaling")
    moe = cfg["model_type"] == "mixtral"
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        L = "model.layers.%d." % i
        h = rms_norm(x, w[L + "input_layernorm.weight"], eps)
        q = (h @ w[L + "self_attn.q_proj.weight"].T).reshape(T, H, D).transpose(1, 0, 2)
        k = (h @ w[L + "self_attn.k_proj.weight"].T).reshape(T, KV, D).transpose(1, 0, 2)
        v = (h @ w[L + "self_attn.v_proj.weight"].T).reshape(T, KV, D).transpose(1, 0, 2)
        q, k = rope(q, theta), rope(k, theta)
        k, v = np.repeat(k, H // KV, axis=0), np.repeat(v, H // KV, axis=0)   # query head j
        y = attention(q, k, v).transpose(1, 0, 2).reshape(T, H * D)           # uses j // (H/KV)
        x = x + y @ w[L + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[L + "post_attention_layernorm.weight"], eps)
        if not moe:
            M = L + "mlp."
            g = silu(h @ w[M + "gate_proj.weight"].T) * (h @ w[M + "up_proj.weight"].T)
            x = x + g @ w[M + "down_proj.weight"].T
            continue
        # Mixtral: softmax over every expert, the top k kept and renormalised
        M = L + "block_sparse_moe."
        probs = softmax(h @ w[M + "gate.weight"].T)
        K = cfg["num_experts_per_tok"]
        out = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-probs[t], kind="stable")[:K]
            for e in top:
                E = M + "experts.%d." % e
                g = silu(w[E + "w1.weight"] @ h[t]) * (w[E + "w3.weight"] @ h[t])
                out[t] += probs[t, e] / probs[t, top].sum() * (w[E + "w2.weight"] @ g)
        x = x + out
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def main():
    d, tokens, gbs, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    w = read_weights(d)
    logits_of = {"gpt2": gpt2_logits, "llama": llama_logits, "mixtral": llama_logits}
    tok = read_tokens(tokens)
    total, n = 0.0, 0
    for j in range(gbs):
        s = tok[j * T:j * T + T + 1]
        logits = logits_of[cfg["model_type"]](cfg, w, s[:-1])
        assert logits.shape[1] == cfg["vocab_size"]
        m = logits.max(axis=-1)
        lse = m + np.log(np.exp(logits - m[:, None]).sum(axis=-1))
        total += (lse - logits[np.arange(T), s[1:]]).sum()
        n += T
    print("%.12f" % (total / n))


if __name__ == "__main__":
    main()
