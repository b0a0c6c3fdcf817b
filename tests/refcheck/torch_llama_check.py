#!/usr/bin/env python3
"""tests/refcheck/torch_llama_check.py: cross-checks build/ref/gpt2_ref --arch llama against
PyTorch (float64) autograd.

Trains the same Llama (or, with --experts, Mixtral-style) model from the same --init on the same
data with torch.optim.AdamW and clip_grad_norm_, written here from Hugging Face's modeling_llama /
modeling_mixtral formulas rather than from the reference: LlamaRMSNorm (weight * x *
rsqrt(mean(x^2) + eps)), rotary embedding by cos/sin tables and rotate_half, grouped-query
attention by repeating each key/value head (repeat_kv) under a causal mask, LlamaMLP
down(silu(gate(x)) * up(x)), untied or tied lm_head. The MoE routes like MixtralSparseMoeBlock
(softmax over all experts, top-k of it by a stable sort, renormalised unless --pre-softmax),
applies each expert to its tokens and scales its w2 output by the routing weight, then adds the
reference's documented capacity rule and Switch aux loss (tests/ref/README.md) and optimises
mean CE + (1/micro-batches) * sum of the micro-batches' aux losses. Compares each step's loss,
[aux_loss,] lr and grad norm with the reference's JSONL log (1e-12 relative) and the final
weights with its --save file (one float32 ulp). Called by tests/refcheck/suite.sh only when
torch imports.

usage: torch_llama_check.py --init INIT --data DATA --log LOG --final FINAL
                            [the model and run flags of gpt2_ref, e.g. --layers 2 --hidden 16
                             --heads 4 --kv-heads 2 --ffn 24 --seq 12 --vocab 64 --mbs 2 --nmb 2
                             --lr 1e-2 --min-lr 1e-3 --warmup 2 --steps 8]
                            [--golden FILE NAME]
Prints one line saying why and exits 1 on a mismatch. With --golden, appends torch's
"NAME step loss aux_loss lr grad_norm" lines (aux_loss 0 without experts): that is how
tests/refcheck/torch_llama_golden.txt was made (suite.sh, test torch-llama-golden).
"""
import argparse
import math

import torch
import torch.nn.functional as F

from torch_common import (DT, capacity_keep, compare_weights, golden_lines, leaf_params, lr_at,
                          micro_batched, read_tokens, replay, run, step_batch, switch_aux)


def rms_norm(x, w, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + eps))


def rotary_tables(T, D, theta):
    """cos, sin (T, D) of Llama's rotary embedding at positions 0..T-1."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=DT) / D))
    freqs = torch.outer(torch.arange(T, dtype=DT), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def repeat_kv(x, n_rep):
    """(B, K, T, D) -> (B, K*n_rep, T, D), each key/value head n_rep times in a row."""
    B, K, T, D = x.shape
    return x[:, :, None, :, :].expand(B, K, n_rep, T, D).reshape(B, K * n_rep, T, D)


def attention(p, pre, x, a):
    B, T, C = x.shape
    H, K = a.heads, a.kv_heads
    D = C // H
    q = (x @ p[pre + "self_attn.q_proj.weight"].t()).view(B, T, H, D).transpose(1, 2)
    k = (x @ p[pre + "self_attn.k_proj.weight"].t()).view(B, T, K, D).transpose(1, 2)
    v = (x @ p[pre + "self_attn.v_proj.weight"].t()).view(B, T, K, D).transpose(1, 2)
    cos, sin = rotary_tables(T, D, a.rope_theta)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k, v = repeat_kv(k, H // K), repeat_kv(v, H // K)
    w = q @ k.transpose(2, 3) / math.sqrt(D)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    w = w.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    y = (w @ v).transpose(1, 2).reshape(B, T, H * D)
    return y @ p[pre + "self_attn.o_proj.weight"].t()


def mlp(p, pre, x):
    gate = x @ p[pre + "mlp.gate_proj.weight"].t()
    up = x @ p[pre + "mlp.up_proj.weight"].t()
    return (F.silu(gate) * up) @ p[pre + "mlp.down_proj.weight"].t()


def sparse_moe(p, pre, x, a):
    """Mixtral's block with the reference's capacity and aux loss: (out, aux) for x (B, T, C)."""
    B, T, C = x.shape
    N, E, K = B * T, a.experts, a.top_k
    xf = x.reshape(N, C)                                  # row n = b*T + t
    logits = xf @ p[pre + "block_sparse_moe.gate.weight"].t()
    scores = F.softmax(logits, dim=1)
    top = torch.sort(scores.detach(), dim=1, descending=True, stable=True).indices[:, :K]
    weights = scores.gather(1, top)
    if not a.pre_softmax:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    keep = capacity_keep(top, B, T, E, a.capacity)
    out = torch.zeros(N, C)
    for e in range(E):
        rows, slots = ((top == e) & keep).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        ex = pre + "block_sparse_moe.experts.%d." % e
        h = xf[rows]
        h = F.silu(h @ p[ex + "w1.weight"].t()) * (h @ p[ex + "w3.weight"].t())
        y = (h @ p[ex + "w2.weight"].t()) * weights[rows, slots, None]
        out = out.index_add(0, rows, y)
    aux = torch.zeros(())
    if a.aux_coeff > 0:
        aux = switch_aux(scores, top, E, a.aux_coeff)
    return out.reshape(B, T, C), aux


def forward(p, idx, a):
    """Logits of the model on idx (B, T) and the sum over layers of the aux losses."""
    x = p["model.embed_tokens.weight"][idx]
    aux = torch.zeros(())
    for i in range(a.layers):
        pre = "model.layers.%d." % i
        x = x + attention(p, pre, rms_norm(x, p[pre + "input_layernorm.weight"], a.norm_eps), a)
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], a.norm_eps)
        if a.experts:
            out, layer_aux = sparse_moe(p, pre, h, a)
            aux = aux + layer_aux
        else:
            out = mlp(p, pre, h)
        x = x + out
    x = rms_norm(x, p["model.norm.weight"], a.norm_eps)
    head = p["model.embed_tokens.weight" if a.tie_embeddings else "lm_head.weight"]
    return x @ head.t(), aux


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("init", "data", "log", "final"):
        ap.add_argument("--" + name, required=True)
    ap.add_argument("--arch", default="llama", choices=["llama"])
    for name in ("layers", "hidden", "heads", "seq", "vocab", "steps"):
        ap.add_argument("--" + name, type=int, required=True)
    for name, default in (("kv-heads", 0), ("ffn", 0), ("mbs", 1), ("nmb", 1), ("dp", 1),
                          ("warmup", 0), ("decay-steps", -1), ("experts", 0), ("top-k", 0),
                          ("expert-ffn", 0)):
        ap.add_argument("--" + name, type=int, default=default)
    for name, default in (("lr", 6e-4), ("min-lr", -1.0), ("rope-theta", 10000.0),
                          ("norm-eps", 1e-5), ("aux-coeff", 0.0), ("capacity", 0.0)):
        ap.add_argument("--" + name, type=float, default=default)
    ap.add_argument("--tie-embeddings", action="store_true")
    ap.add_argument("--pre-softmax", action="store_true")
    # capacity_keep drops by position; the reference's default drop policy is probs
    ap.add_argument("--drop-policy", default="position", choices=["position"])
    ap.add_argument("--golden", nargs=2, metavar=("FILE", "NAME"))
    a = ap.parse_args(argv)
    a.kv_heads = a.kv_heads or a.heads
    if a.min_lr < 0:
        a.min_lr = 0.1 * a.lr
    if a.decay_steps < 0:
        a.decay_steps = max(a.steps, a.warmup)
    return a


def main(argv):
    a = parse(argv)
    params = leaf_params(a.init)
    want = {"model.embed_tokens.weight": [a.vocab, a.hidden],
            "model.layers.0.self_attn.k_proj.weight": [a.kv_heads * (a.hidden // a.heads),
                                                       a.hidden]}
    if a.experts:
        want["model.layers.0.block_sparse_moe.experts.%d.w1.weight" % (a.experts - 1)] = [
            a.expert_ffn or a.ffn, a.hidden]
    else:
        want["model.layers.0.mlp.gate_proj.weight"] = [a.ffn, a.hidden]
    for name, shape in want.items():
        if name not in params or list(params[name].shape) != shape:
            return "%s: no %s of shape %s" % (a.init, name, shape)
    if ("lm_head.weight" in params) == a.tie_embeddings:
        return "%s: lm_head.weight present/absent against --tie-embeddings" % a.init
    tokens = read_tokens(a.data)
    gbs = a.mbs * a.nmb * a.dp

    def objective(s):
        return micro_batched(lambda idx: forward(params, idx, a),
                             step_batch(tokens, s, gbs, a.seq), a.mbs, a.vocab)

    why, rows, worst = replay(params, a.log, a.steps,
                              lambda t: lr_at(t, a.lr, a.min_lr, a.warmup, a.decay_steps, gbs),
                              objective, ["loss", "aux_loss"] if a.experts else ["loss"])
    if why:
        return why
    if a.golden:
        with open(a.golden[0], "a") as f:
            f.writelines(golden_lines(rows, ("loss", "aux_loss", "lr", "grad_norm"),
                                      a.golden[1] + " "))
    why = compare_weights(a.final, params)
    if why:
        return why
    print("torch agrees: %d steps, worst relative difference of loss/%slr/norm %.2g" % (
        a.steps, "aux/" if a.experts else "", worst))
    return None


if __name__ == "__main__":
    run(main)
