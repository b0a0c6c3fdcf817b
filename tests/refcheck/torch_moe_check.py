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
import torch

from torch_check import gelu, gpt_forward
from torch_common import (capacity_keep, compare_weights, golden_lines, leaf_params, lr_at,
                          micro_batched, read_tokens, replay, run, step_batch, switch_aux)


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
    keep = capacity_keep(top, B, T, E, cap)
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
        aux = switch_aux(torch.softmax(logits, dim=1), top, E, aux_coeff)
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
    params = leaf_params(init)
    if params["h.0.mlp.experts.0.c_fc.weight"].shape[1] != FE:
        return "expert width in %s is not %d" % (init, FE)
    tokens = read_tokens(data)
    gbs = mbs * nmb * dp

    def objective(s):
        return micro_batched(lambda idx: forward(params, idx, L, H, moe),
                             step_batch(tokens, s, gbs, T), mbs, V)

    why, rows, worst = replay(params, log, steps,
                              lambda t: lr_at(t, lr, min_lr, warmup, decay, gbs),
                              objective, ["loss", "aux_loss"])
    if why:
        return why
    if golden:
        with open(golden[0], "a") as f:
            f.writelines(golden_lines(rows, ("loss", "aux_loss", "lr", "grad_norm"),
                                      golden[1] + " "))
    why = compare_weights(final, params)
    if why:
        return why
    print("torch agrees: %d steps, worst relative difference of loss/aux/lr/norm %.2g" % (
        steps, worst))
    return None


if __name__ == "__main__":
    run(main)
