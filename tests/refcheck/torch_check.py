#!/usr/bin/env python3
"""tests/refcheck/torch_check.py: cross-checks build/ref/gpt2_ref against PyTorch (float64).

Trains the same model from the same --init on the same data with torch.optim.AdamW and
torch.nn.utils.clip_grad_norm_, the model written as Hugging Face's GPT2LMHeadModel computes it
(Conv1D = x @ W + b, gelu_new, masked softmax attention, tied head), the whole global batch in
one forward. Compares each step's loss, lr and grad norm with the reference's JSONL log and the
final weights with its --save file. Called by tests/refcheck/suite.sh only when torch imports.

usage: torch_check.py INIT.safetensors DATA LOG.jsonl FINAL.safetensors L C H T V MBS NMB DP
                      LR MIN_LR WARMUP DECAY_STEPS STEPS [GOLDEN.txt]
Prints one line saying why and exits 1 on a mismatch. With GOLDEN.txt, also writes torch's
"step loss lr grad_norm" per line (%.17g): that is how tests/refcheck/torch_golden.txt, which
the suite checks without torch, was made (see suite.sh, test torch-golden).
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

DT = torch.float64


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(raw[base + b:base + e]), dtype=torch.float32)
        out[name] = t.reshape(info["shape"]).to(DT)
    return out


def read_tokens(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) >= 1024 and struct.unpack("<i", raw[:4])[0] == 20240520:
        n = struct.unpack("<i", raw[8:12])[0]
        raw = raw[1024:1024 + 2 * n]
    return list(struct.unpack("<%dH" % (len(raw) // 2), raw))


def lr_at(t, lr, min_lr, warmup, decay):
    """The learning rate of step t (1-based): linear warm-up, cosine decay, then min_lr."""
    if warmup > 0 and t <= warmup:
        return lr * t / warmup
    if t <= decay:
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * (t - warmup) /
                                                            (decay - warmup)))
    return min_lr


def step_batch(tokens, s, gbs, T):
    """The global batch of step s (0-based): samples s*gbs .. s*gbs+gbs-1, wrapping, each
    T + 1 tokens (T inputs, the next T as targets)."""
    nsamples = (len(tokens) - 1) // T
    rows = [(s * gbs + j) % nsamples for j in range(gbs)]
    return torch.tensor([tokens[i * T:i * T + T + 1] for i in rows])


def gelu(f):
    return 0.5 * f * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (f + 0.044715 * f.pow(3))))


def dense_mlp(p, h, a):
    f = gelu(a @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"])
    return f @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"], 0.0


def gpt_forward(p, idx, L, H, mlp):
    """Logits of GPT-2 on idx [B, T] and the sum over layers of mlp's second result (an
    auxiliary loss); mlp(p, "h.i.", ln_2 output) -> (output, aux)."""
    B, T = idx.shape
    C = p["wte.weight"].shape[1]
    x = p["wte.weight"][idx] + p["wpe.weight"][torch.arange(T)]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    aux = torch.zeros(())
    for i in range(L):
        h = "h.%d." % i
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).permute(0, 2, 1, 3) for t in (q, k, v))
        w = q @ k.transpose(-1, -2) / math.sqrt(v.size(-1))
        w = torch.where(causal, w, torch.tensor(torch.finfo(DT).min, dtype=DT))
        y = (w.softmax(dim=-1) @ v).permute(0, 2, 1, 3).reshape(B, T, C)
        x = x + (y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"])
        a = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        out, layer_aux = mlp(p, h, a)
        x = x + out
        aux = aux + layer_aux
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    return x @ p["wte.weight"].t(), aux


def forward(p, idx, L, H):
    return gpt_forward(p, idx, L, H, dense_mlp)[0]


def main(argv):
    golden = argv[17] if len(argv) > 17 else None
    (init, data, log, final, L, C, H, T, V, mbs, nmb, dp, lr, min_lr, warmup, decay,
     steps) = argv[:17]
    L, C, H, T, V, mbs, nmb, dp, warmup, decay, steps = map(
        int, (L, C, H, T, V, mbs, nmb, dp, warmup, decay, steps))
    lr, min_lr = float(lr), float(min_lr)
    params = {k: v.clone().requires_grad_(True) for k, v in read_safetensors(init).items()}
    decay_names = [k for k in params if params[k].dim() == 2]
    other_names = [k for k in params if params[k].dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": [params[k] for k in decay_names], "weight_decay": 0.1},
         {"params": [params[k] for k in other_names], "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8)
    tokens = read_tokens(data)
    gbs = mbs * nmb * dp
    with open(log) as f:
        ref_log = [json.loads(line) for line in f]
    if len(ref_log) != steps:
        return "log has %d lines, want %d" % (len(ref_log), steps)
    worst = 0.0
    rows_out = []
    for s in range(steps):
        t = s + 1
        rate = lr_at(t, lr, min_lr, warmup, decay)
        for g in opt.param_groups:
            g["lr"] = rate
        batch = step_batch(tokens, s, gbs, T)
        logits = forward(params, batch[:, :-1], L, H)
        loss = F.cross_entropy(logits.reshape(-1, V), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0).item()
        opt.step()
        rows_out.append("%d %.17g %.17g %.17g\n" % (t, loss.item(), rate, norm))
        r = ref_log[s]
        for key, mine in (("loss", loss.item()), ("lr", rate), ("grad_norm", norm)):
            rel = abs(r[key] - mine) / max(abs(mine), 1e-300)
            worst = max(worst, rel)
            if r["step"] != t or rel > 1e-12:
                return "step %d: %s %.17g in the reference, %.17g in torch" % (
                    t, key, r[key], mine)
    if golden:
        with open(golden, "w") as f:
            f.writelines(rows_out)
    saved = read_safetensors(final)
    for k, v in params.items():
        mine = v.detach()
        diff = (saved[k] - mine).abs() - 1.2e-7 * mine.abs()   # one float32 ulp of slack
        if diff.max().item() > 1e-12:
            i = int(diff.argmax())
            return "%s[%d]: reference %.9g, torch %.9g" % (
                k, i, saved[k].flatten()[i].item(), mine.flatten()[i].item())
    print("torch agrees: %d steps, worst relative difference of loss/lr/norm %.2g" % (
        steps, worst))
    return None


if __name__ == "__main__":
    torch.set_default_dtype(DT)
    why = main(sys.argv[1:])
    if why:
        print(why)
        sys.exit(1)
