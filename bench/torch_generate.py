#!/usr/bin/env python3
# bench/torch_generate.py: PyTorch (eager, CPU, f32) side of bench/generate_bench.sh: greedy
# generation with a key/value cache from the same safetensors file and prompt as our generate
# program; prints the tokens and one JSON line of prefill and decode times. Not a test and not
# a reference for numerics (tests/ref is): it only has to do the same work, with the same
# model as Hugging Face defines it:
#   GPT-2 (GPT2LMHeadModel): learned positions, pre-LN blocks, Conv1D weights (in, out), GELU
#     tanh ("gelu_new"), LayerNorm eps from --eps, tied head;
#   Llama (LlamaForCausalLM): RMSNorm (in f32), rotary positions (rotate_half), grouped-query
#     attention, SwiGLU, nn.Linear weights (out, in), lm_head or the tied embedding.
# Attention over the cache: softmax(q k^T / sqrt(hd)) v with the causal mask on the prefill.
#
#   python3 bench/torch_generate.py --init W.safetensors --arch gpt|llama --heads H
#       [--kv-heads K] [--rope-theta X] --eps X --prompt-ids 1,2,3 --new N --threads T
import argparse
import json
import math
import struct
import sys
import time

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def load(path):
    """The tensors of a safetensors file as f32 torch tensors, by name."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).float()
    return out


class Model:
    def __init__(self, w, a):
        self.w, self.a = w, a
        self.llama = a.arch == "llama"
        self.layers = sum(1 for k in w if k.endswith(("ln_1.weight", "input_layernorm.weight")))
        emb = w["model.embed_tokens.weight" if self.llama else "wte.weight"]
        self.wte = emb
        self.head = w.get("lm_head.weight", emb)
        self.c = emb.shape[1]
        self.hd = self.c // a.heads
        self.kv = a.kv_heads or a.heads
        if self.llama:
            inv = 1.0 / (a.rope_theta ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
            self.inv = inv
        self.cache = [None] * self.layers

    def rope(self, x, pos):             # x (heads, t, hd)
        ang = pos[:, None].double() * self.inv[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1).float()
        sin = torch.cat([ang.sin(), ang.sin()], -1).float()
        h = self.hd // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], -1)
        return x * cos + rot * sin

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.a.eps) * w

    def attend(self, l, q, k, v, pos0):
        if pos0 == 0:
            self.cache[l] = (k, v)
        else:
            pk, pv = self.cache[l]
            self.cache[l] = (torch.cat([pk, k], 1), torch.cat([pv, v], 1))
        k, v = self.cache[l]
        rep = q.shape[0] // k.shape[0]
        if rep > 1:
            k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        t, tk = q.shape[1], k.shape[1]
        if t > 1:
            mask = torch.ones(t, tk, dtype=torch.bool).triu(tk - t + 1)
            s = s.masked_fill(mask, float("-inf"))
        return s.softmax(-1) @ v                      # (heads, t, hd)

    def forward(self, tok, pos0):
        w, t = self.w, len(tok)
        x = self.wte[tok]
        pos = torch.arange(pos0, pos0 + t)
        if not self.llama:
            x = x + w["wpe.weight"][pos]
        for l in range(self.layers):
            if self.llama:
                p = "model.layers.%d." % l
                h = self.rms(x, w[p + "input_layernorm.weight"])
                q = (h @ w[p + "self_attn.q_proj.weight"].T).view(t, -1, self.hd).transpose(0, 1)
                k = (h @ w[p + "self_attn.k_proj.weight"].T).view(t, -1, self.hd).transpose(0, 1)
                v = (h @ w[p + "self_attn.v_proj.weight"].T).view(t, -1, self.hd).transpose(0, 1)
                q, k = self.rope(q, pos), self.rope(k, pos)
                y = self.attend(l, q, k, v, pos0).transpose(0, 1).reshape(t, -1)
                x = x + y @ w[p + "self_attn.o_proj.weight"].T
                h = self.rms(x, w[p + "post_attention_layernorm.weight"])
                g = F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
                x = x + g @ w[p + "mlp.down_proj.weight"].T
            else:
                p = "h.%d." % l
                h = F.layer_norm(x, (self.c,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], self.a.eps)
                qkv = h @ w[p + "attn.c_attn.weight"] + w.get(p + "attn.c_attn.bias", 0)
                q, k, v = (z.view(t, -1, self.hd).transpose(0, 1) for z in qkv.split(self.c, -1))
                y = self.attend(l, q, k, v, pos0).transpose(0, 1).reshape(t, -1)
                x = x + y @ w[p + "attn.c_proj.weight"] + w.get(p + "attn.c_proj.bias", 0)
                h = F.layer_norm(x, (self.c,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], self.a.eps)
                h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w.get(p + "mlp.c_fc.bias", 0),
                           approximate="tanh")
                x = x + h @ w[p + "mlp.c_proj.weight"] + w.get(p + "mlp.c_proj.bias", 0)
        last = x[-1:]
        if self.llama:
            last = self.rms(last, w["model.norm.weight"])
        else:
            last = F.layer_norm(last, (self.c,), w["ln_f.weight"], w["ln_f.bias"], self.a.eps)
        return (last @ self.head.T)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True)
    ap.add_argument("--arch", choices=["gpt", "llama"], required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--new", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m = Model(load(a.init), a)
    seq = [int(s) for s in a.prompt_ids.split(",")]
    p = len(seq)
    with torch.no_grad():
        t0 = time.perf_counter()
        logits = m.forward(torch.tensor(seq), 0)
        seq.append(int(logits.argmax()))
        t1 = time.perf_counter()
        for _ in range(a.new - 1):
            logits = m.forward(torch.tensor(seq[-1:]), len(seq) - 1)
            seq.append(int(logits.argmax()))
        t2 = time.perf_counter()
    print("tokens: " + " ".join(str(s) for s in seq))
    print(json.dumps({"prompt": p, "new": a.new, "prefill_ms": (t1 - t0) * 1e3,
                      "decode_ms": (t2 - t1) * 1e3,
                      "prefill_tok_s": p / (t1 - t0),
                      "decode_tok_s": (a.new - 1) / (t2 - t1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
