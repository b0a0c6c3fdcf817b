"""tests/refcheck/torch_common.py: what the PyTorch cross-checks in tests/refcheck share.

Readers of the reference's files (safetensors as float64, token files, the JSONL log), its
learning-rate schedule and batching, the two MoE rules it documents in tests/ref/README.md
(capacity and the Switch aux loss), and the replay of a reference run with torch.optim.AdamW and
clip_grad_norm_ compared step by step, then weight by weight. Not a script and no model: imported
by torch_check.py (GPT-2), torch_moe_check.py and torch_llama_check.py, which write the model.
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


def lr_at(t, lr, min_lr, warmup, decay, gbs, style="cosine", lr_init=0.0, wsd_steps=0,
          wsd_style="exponential"):
    """The learning rate of step t (1-based), tests/ref/README.md's formula (Megatron's): the
    rate for n = (t - 1) * gbs samples seen, with warm-up, decay and WSD lengths in samples."""
    n, W, S = (t - 1) * gbs, warmup * gbs, decay * gbs
    if W > 0 and n <= W:
        return lr_init + (lr - lr_init) * n / W
    if style == "constant":
        return lr
    if n > S:
        return min_lr
    if style == "inverse-square-root":
        return max(min_lr, lr * math.pow(max(W, 1), 0.5) / math.pow(max(n, 1), 0.5))
    r = (n - W) / (S - W)
    if style == "linear":
        c = 1.0 - r
    elif style == "cosine":
        c = 0.5 * (math.cos(math.pi * r) + 1.0)
    else:                                                 # WSD
        D = wsd_steps * gbs
        q = (n - (S - D)) / D if n > S - D else 0.0
        c = {"exponential": 2.0 * math.pow(0.5, q) - 1.0, "linear": 1.0 - q,
             "cosine": 0.5 * (math.cos(math.pi * q) + 1.0), "minus_sqrt": 1.0 - math.sqrt(q)
             }[wsd_style] if n > S - D else 1.0
    return min_lr + c * (lr - min_lr)


def step_batch(tokens, s, gbs, T):
    """The global batch of step s (0-based): samples s*gbs .. s*gbs+gbs-1, wrapping, each
    T + 1 tokens (T inputs, the next T as targets)."""
    nsamples = (len(tokens) - 1) // T
    rows = [(s * gbs + j) % nsamples for j in range(gbs)]
    return torch.tensor([tokens[i * T:i * T + T + 1] for i in rows])


def capacity_keep(top, B, T, E, factor):
    """Which of the top-k choices top (N = B*T, k; row n = b*T + t) survive the capacity rule:
    with factor > 0 each expert takes at most ceil((N*k / E) * factor) choices, first come in
    token order (t, b) and slot order; with factor 0 all do. A bool tensor (N, k)."""
    N, K = top.shape
    keep = torch.ones(N, K, dtype=torch.bool)
    if factor > 0:
        cap = math.ceil((N * K / E) * factor)
        taken = [0] * E
        for t in range(T):                                # token order (t, b)
            for b in range(B):
                for j in range(K):
                    e = int(top[b * T + t, j])
                    keep[b * T + t, j] = taken[e] < cap
                    taken[e] += int(keep[b * T + t, j])
    return keep


def switch_aux(scores, top, E, coeff):
    """The Switch aux loss of one micro-batch: scores (N, E) the softmax over all experts, top
    (N, k) the choices before any drop; coeff * E / (N^2 k) * sum_e (sum_n scores) * count_e."""
    N, K = top.shape
    counts = torch.zeros(E).index_add(0, top.reshape(-1), torch.ones(N * K))
    return (scores.sum(dim=0) * counts).sum() * (E * coeff / (N * N * K))


def leaf_params(path):
    """The tensors of safetensors file 'path' as float64 leaves that collect gradients."""
    return {k: v.clone().requires_grad_(True) for k, v in read_safetensors(path).items()}


def micro_batched(forward, batch, mbs, V):
    """Forward and backward of a global batch (gbs, T + 1) in micro-batches of mbs sequences;
    forward(idx (mbs, T)) -> (logits, aux loss). The objective, as the reference's, is mean CE +
    (1/micro-batches) * sum of the micro-batches' aux losses. Returns its two parts as
    {"loss": .., "aux_loss": ..}."""
    gbs, T = batch.shape[0], batch.shape[1] - 1
    nmb_total = gbs // mbs
    ce_sum, aux_sum = 0.0, 0.0
    for m0 in range(0, gbs, mbs):                         # one micro-batch of mbs sequences
        mb = batch[m0:m0 + mbs]
        logits, aux = forward(mb[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, V), mb[:, 1:].reshape(-1), reduction="sum")
        (ce / (gbs * T) + aux / nmb_total).backward()
        ce_sum += ce.item()
        aux_sum += aux.item()
    return {"loss": ce_sum / (gbs * T), "aux_loss": aux_sum / nmb_total}


def replay(params, log, steps, lr_of, objective, keys):
    """Replays a reference run on 'params' (name -> leaf tensor) and compares it with the
    reference's JSONL 'log'. Step t = 1..steps: AdamW (betas 0.9, 0.95, eps 1e-8, weight decay
    0.1 on the 2-D tensors only) at lr_of(t); objective(t - 1) runs the forward and backward of
    that step's batch and returns a dict of values ("loss", ...); clip_grad_norm_ to 1.0, step.
    'keys' of those values, then "lr" and "grad_norm", must agree with the log's to 1e-12
    relative. Returns (why, rows, worst): why is None or the first mismatch, rows one dict per
    step (step, lr, grad_norm and the objective's values), worst the largest relative
    difference seen."""
    decay_names = [k for k in params if params[k].dim() == 2]
    other_names = [k for k in params if params[k].dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": [params[k] for k in decay_names], "weight_decay": 0.1},
         {"params": [params[k] for k in other_names], "weight_decay": 0.0}],
        lr=lr_of(1), betas=(0.9, 0.95), eps=1e-8)
    with open(log) as f:
        ref_log = [json.loads(line) for line in f]
    if len(ref_log) != steps:
        return "log has %d lines, want %d" % (len(ref_log), steps), [], 0.0
    worst = 0.0
    rows = []
    for s in range(steps):
        t = s + 1
        rate = lr_of(t)
        for g in opt.param_groups:
            g["lr"] = rate
        opt.zero_grad()
        row = objective(s)
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0).item()
        opt.step()
        row.update(step=t, lr=rate, grad_norm=norm)
        rows.append(row)
        r = ref_log[s]
        for key in list(keys) + ["lr", "grad_norm"]:
            rel = abs(r[key] - row[key]) / max(abs(row[key]), 1e-300)
            worst = max(worst, rel)
            if r["step"] != t or rel > 1e-12:
                return "step %d: %s %.17g in the reference, %.17g in torch" % (
                    t, key, r[key], row[key]), rows, worst
    return None, rows, worst


def golden_lines(rows, keys, prefix=""):
    """One line "PREFIXstep v1 v2 ..." (%.17g) per row of replay, with the values of 'keys'."""
    return [prefix + " ".join(["%d" % r["step"]] + ["%.17g" % r[k] for k in keys]) + "\n"
            for r in rows]


def compare_weights(path, params):
    """None if the reference's --save file 'path' holds exactly the tensors of 'params', each
    within one float32 ulp of torch's (plus 1e-12); else what differs first."""
    saved = read_safetensors(path)
    if sorted(saved) != sorted(params):
        return "the --save file's tensor names differ from the --init file's"
    for k, v in params.items():
        mine = v.detach()
        diff = (saved[k] - mine).abs() - 1.2e-7 * mine.abs()   # one float32 ulp of slack
        if diff.max().item() > 1e-12:
            i = int(diff.argmax())
            return "%s[%d]: reference %.9g, torch %.9g" % (
                k, i, saved[k].flatten()[i].item(), mine.flatten()[i].item())
    return None


def run(main):
    """The scripts' entry: main(argv) in float64, which returns None or says why it failed;
    prints that and exits 1 then."""
    torch.set_default_dtype(DT)
    why = main(sys.argv[1:])
    if why:
        print(why)
        sys.exit(1)
