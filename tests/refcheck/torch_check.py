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
import math

import torch
import torch.nn.functional as F

from torch_common import (DT, compare_weights, golden_lines, leaf_params, lr_at, read_tokens,
                          replay, run, step_batch)


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
    params = leaf_params(init)
    tokens = read_tokens(data)
    gbs = mbs * nmb * dp

    def objective(s):                                     # the whole global batch at once
        batch = step_batch(tokens, s, gbs, T)
        logits = forward(params, batch[:, :-1], L, H)
        loss = F.cross_entropy(logits.reshape(-1, V), batch[:, 1:].reshape(-1))
        loss.backward()
        return {"loss": loss.item()}

    why, rows, worst = replay(params, log, steps,
                              lambda t: lr_at(t, lr, min_lr, warmup, decay, gbs),
                              objective, ["loss"])
    if why:
        return why
    if golden:
        with open(golden, "w") as f:
            f.writelines(golden_lines(rows, ("loss", "lr", "grad_norm")))
    why = compare_weights(final, params)
    if why:
        return why
    print("torch agrees: %d steps, worst relative difference of loss/lr/norm %.2g" % (
        steps, worst))
    return None


if __name__ == "__main__":
    run(main)
