#!/usr/bin/env python3
# bench/torch_gpt.py: PyTorch (eager, CPU) side of bench/train_bench.sh: trains a GPT-2 with the
# shapes of our generated program for --steps steps and prints one JSON line of step times.
# Not a test and not a reference for numerics (tests/ref is): it only has to do the same work.
#
#   OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 taskset -c 0-1 python3 bench/torch_gpt.py \
#       --layers 12 --hidden 768 --heads 12 --vocab 50304 --seq 64 --batch 4 --threads 2 [--bf16]
#
# The model: GPT-2 as Megatron and our program train it: learned positions, pre-LN blocks,
# fused qkv Linear, causal attention written out (q k^T * scale, mask, softmax, @ v: torch 1.13
# has no fused attention), GELU tanh, tied token embedding / LM head, no dropout; AdamW
# (torch's default implementation for CPU tensors: the per-tensor loop), betas (0.9, 0.95),
# weight decay 0.1 on matrices only, gradient clipping at 1.0, as our program. The vocabulary is
# the padded one our program computes (--vocab), so the logits GEMMs have the same shape.
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.attn_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x, mask):
        b, t, c = x.shape
        hd = c // self.heads
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, c, heads, vocab, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(seq, c)
        self.h = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.h:
            x = block(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()     # tied LM head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description="PyTorch CPU side of bench/train_bench.sh")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True, help="padded vocabulary")
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--bf16", action="store_true",
                    help="forward under torch.autocast(cpu, bfloat16): bf16 matmuls, fp32 "
                         "parameters, gradients and AdamW (torch's mixed precision on the CPU)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    model = GPT(a.layers, a.hidden, a.heads, a.vocab, a.seq)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(1)
    ms = []
    for step in range(a.warmup + a.steps):
        tok = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = model(tok[:, :-1], tok[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = (time.perf_counter() - t0) * 1e3
        if step >= a.warmup:
            ms.append(dt)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "bf16": a.bf16,
                      "loss": round(loss.item(), 4), "ms": [round(x, 3) for x in ms],
                      "ms_median": round(statistics.median(ms), 3)}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
