#!/usr/bin/env python3
"""tests/refcheck/torch_moe_check.py: cross-checks the reference's mixture of experts
against PyTorch (float64) autograd.

Trains the same MoE GPT from the same --init on the same data with torch.optim.AdamW and
clip_grad_norm_. The MoE layer is written the way Megatron computes it, not the way the
reference does: routing on the whole micro-batch at once (top-k by a stable descending sort, so
equal logits keep the lower expert first), experts applied per expert to the tokens routed to
it, the probability multiplied into the activation before fc2 and into the fc2 bias, outputs
scattered back with index_add, the Switch aux loss from a fresh softmax over all experts, and the
objective mean CE + (1/micro-batches) * sum of the micro-batches' aux losses, differentiated by
autograd. Compares each step's loss, aux_loss, lr and grad norm with the reference's JSONL log
(1e-12 relative) and the final weights with its --save file (one float32 ulp).

usage: torch_moe_check.py INIT DATA LOG FINAL L C H T V MBS NMB DP LR MIN_LR WARMUP DECAY STEPS
                          E K FE BIAS PRE_SOFTMAX AUX_COEFF CAPACITY [GOLDEN.txt NAME]
BIAS and PRE_SOFTMAX are 0 or 1, CAPACITY 0 for none. Prints one line saying why and exits 1
on a mismatch. With GOLDEN.txt, appends torch's "NAME step loss aux_loss lr grad_norm" lines:
that is how tests/refcheck/torch_moe_golden.txt was made (suite.sh, test torch-moe-golden).
"""
import json
import math
import sys

import torch
import torch.nn.functional as F

from torch_check import DT, gelu, gpt_forward, lr_at, read_safetensors, read_tokens, step_batch


def moe_layer(p, h, x, E, K, bias, pre, aux_coeff, cap):
    """x: (B, T, C) -> (out (B, T, C), aux loss of these B*T tokens)."""
    B, T, C = x.shape
    N = B * T
    xf = x.reshape(N, C)                                  # row n = b*T + t
    logits = xf @ p[h + "mlp.router.weight"].t()          # (N, E)
    top = torch.sort(logits.detach(), dim=1, descending=True, stable=True).indices[:, :K]
    if pre:
        probs = torch.softmax(logits, dim=1).gather(1, top)
    else:
        probs = torch.softmax(logits.gather(1, top), dim=1)
    keep = torch.ones(N, K, dtype=torch.bool)
    if cap > 0:
        capacity = math.ceil((N * K / E) * cap)
        used = [0] * E
        for t in range(T):                                # token order (t, b)
            for b in range(B):
                n = b * T + t
                for j in range(K):
                    e = int(top[n, j])
                    keep[n, j] = used[e] < capacity
                    used[e] += int(keep[n, j])
    out = torch.zeros(N, C)
    for e in range(E):
        rows, slots = ((top == e) & keep).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        ex = h + "mlp.experts.%d." % e
        pr = probs[rows, slots].unsqueeze(1)
        f = xf[rows] @ p[ex + "c_fc.weight"]
        if bias:
            f = f + p[ex + "c_fc.bias"]
        y = (gelu(f) * pr) @ p[ex + "c_proj.weight"]     # Megatron: prob before fc2 ...
        if bias:
            y = y + p[ex + "c_proj.bias"] * pr            # ... and on the fc2 bias
        out = out.index_add(0, rows, y)
    aux = torch.zeros(())
    if aux_coeff > 0:
        scores = torch.softmax(logits, dim=1)
        counts = torch.zeros(E).index_add(0, top.reshape(-1), torch.ones(N * K))
        aux = (scores.sum(dim=0) * counts).sum() * (E * aux_coeff / (N * N * K))
    return out.reshape(B, T, C), aux


def forward(p, idx, L, H, moe):
    return gpt_forward(p, idx, L, H, lambda p, h, a: moe_layer(p, h, a, *moe))


def main(argv):
    golden = argv[24:26] if len(argv) > 25 else None
    (init, data, log, final, L, C, H, T, V, mbs, nmb, dp, lr, min_lr, warmup, decay,
     steps, E, K, FE, bias, pre, aux_coeff, cap) = argv[:24]
    L, C, H, T, V, mbs, nmb, dp, warmup, decay, steps, E, K, FE, bias, pre = map(
        int, (L, C, H, T, V, mbs, nmb, dp, warmup, decay, steps, E, K, FE, bias, pre))
    lr, min_lr, aux_coeff, cap = map(float, (lr, min_lr, aux_coeff, cap))
    moe = (E, K, bias, pre, aux_coeff, cap)
    params = {k: v.clone().requires_grad_(True) for k, v in read_safetensors(init).items()}
    if params["h.0.mlp.experts.0.c_fc.weight"].shape[1] != FE:
        return "expert width in %s is not %d" % (init, FE)
    decay_names = [k for k in params if params[k].dim() == 2]
    other_names = [k for k in params if params[k].dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": [params[k] for k in decay_names], "weight_decay": 0.1},
         {"params": [params[k] for k in other_names], "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8)
    tokens = read_tokens(data)
    gbs = mbs * nmb * dp
    nmb_total = gbs // mbs
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
        opt.zero_grad()
        ce_sum, aux_sum = 0.0, 0.0
        for m0 in range(0, gbs, mbs):                     # one micro-batch of mbs sequences
            mb = batch[m0:m0 + mbs]
            logits, aux = forward(params, mb[:, :-1], L, H, moe)
            ce = F.cross_entropy(logits.reshape(-1, V), mb[:, 1:].reshape(-1), reduction="sum")
            (ce / (gbs * T) + aux / nmb_total).backward()
            ce_sum += ce.item()
            aux_sum += aux.item()
        loss, aux_loss = ce_sum / (gbs * T), aux_sum / nmb_total
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0).item()
        opt.step()
        rows_out.append("%d %.17g %.17g %.17g %.17g\n" % (t, loss, aux_loss, rate, norm))
        r = ref_log[s]
        for key, mine in (("loss", loss), ("aux_loss", aux_loss), ("lr", rate),
                          ("grad_norm", norm)):
            rel = abs(r[key] - mine) / max(abs(mine), 1e-300)
            worst = max(worst, rel)
            if r["step"] != t or rel > 1e-12:
                return "step %d: %s %.17g in the reference, %.17g in torch" % (
                    t, key, r[key], mine)
    if golden:
        with open(golden[0], "a") as f:
            f.writelines(golden[1] + " " + row for row in rows_out)
    saved = read_safetensors(final)
    if sorted(saved) != sorted(params):
        return "the --save file's tensor names differ from the --init file's"
    for k, v in params.items():
        mine = v.detach()
        diff = (saved[k] - mine).abs() - 1.2e-7 * mine.abs()   # one float32 ulp of slack
        if diff.max().item() > 1e-12:
            i = int(diff.argmax())
            return "%s[%d]: reference %.9g, torch %.9g" % (
                k, i, saved[k].flatten()[i].item(), mine.flatten()[i].item())
    print("torch agrees: %d steps, worst relative difference of loss/aux/lr/norm %.2g" % (
        steps, worst))
    return None


if __name__ == "__main__":
    torch.set_default_dtype(DT)
    why = main(sys.argv[1:])
    if why:
        print(why)
        sys.exit(1)
