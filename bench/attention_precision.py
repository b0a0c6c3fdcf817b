#!/usr/bin/env python3
"""bench/attention_precision.py: is bf16 attention without the hi + lo split accurate enough?

    python3 bench/attention_precision.py        (NumPy: python3-numpy, make deps)

A NumPy model of the CUDA forward (lib/kernels_cuda.cu, fa_fwd_kernel): key tiles of 64, the
online softmax in f32, the probabilities rounded to bf16 for the P V product (with the split,
their rounding residual multiplied too), f32 sums, the output rounded to bf16. Its largest
error against float64 attention is printed beside that of attention computed naively in bf16
(each operation's result rounded to bf16, as PyTorch does in bf16), the yardstick
FlashAttention's own tests use: its error at most twice the naive one's. Causal, random q, k, v
(bf16 values, uniform in [-x, x]), 4 draws per shape. A model of the arithmetic, not the
kernel: the summation order inside the tensor cores differs (the kernel tests bound the
kernel's own error).
"""
import sys

try:
    import numpy as np
except ImportError:
    sys.exit("attention_precision.py: needs NumPy (python3-numpy: make deps)")

rng = np.random.default_rng(1)


def bf16(x):
    """x rounded to bf16 (to nearest even), as f32"""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def causal(s):
    """s with the keys after each query masked out"""
    s[np.triu_indices(s.shape[0], 1)] = -np.inf
    return s


def reference(q, k, v):
    """float64 attention"""
    s = causal((q.astype(np.float64) @ k.T.astype(np.float64)) / np.sqrt(q.shape[1]))
    p = np.exp(s - s.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)) @ v.astype(np.float64)


def naive_bf16(q, k, v):
    """attention in bf16 as PyTorch computes it: each operation's result rounded to bf16"""
    s = bf16(q @ k.T)
    s = causal(bf16(s / np.float32(np.sqrt(q.shape[1]))))
    p = np.exp((s - s.max(1, keepdims=True)).astype(np.float32))
    p = bf16(p / p.sum(1, keepdims=True))
    return bf16(p @ v)


def flash(q, k, v, split, tile=64):
    """the kernel's arithmetic: key tiles, online softmax in f32, bf16 probabilities (and,
    with split, their residuals) into P V, f32 sums"""
    T, d = q.shape
    scale = np.float32(1 / np.sqrt(d))
    o = np.zeros((T, d), np.float32)
    m = np.full(T, -np.inf, np.float32)
    l = np.zeros(T, np.float32)
    rows = np.arange(T)[:, None]
    for k0 in range(0, T, tile):
        kt, vt = k[k0:k0 + tile], v[k0:k0 + tile]
        cols = np.arange(k0, k0 + len(kt))[None, :]
        s = np.where(cols <= rows, (q @ kt.T) * scale, -np.inf).astype(np.float32)
        mnew = np.maximum(m, s.max(1))
        alpha = np.where(np.isinf(m), 0.0, np.exp(m - np.where(np.isinf(mnew), 0, mnew)))
        p = np.where(np.isinf(s), 0.0, np.exp(s - mnew[:, None])).astype(np.float32)
        l = l * alpha.astype(np.float32) + p.sum(1)
        m = mnew
        hi = bf16(p)
        pv = hi @ vt
        if split:
            pv += bf16(p - hi) @ vt
        o = o * alpha.astype(np.float32)[:, None] + pv
    return bf16(o / l[:, None])


def main():
    rng = np.random.default_rng(1)
    for T, d, x in [(1024, 64, 1.5), (1024, 64, 4.0), (512, 128, 1.5)]:
        err = {"naive": 0.0, "split": 0.0, "no split": 0.0}
        for _ in range(4):
            q, k, v = (bf16(rng.uniform(-x, x, (T, d))) for _ in range(3))
            r = reference(q, k, v)
            err["naive"] = max(err["naive"], np.abs(naive_bf16(q, k, v) - r).max())
            err["split"] = max(err["split"], np.abs(flash(q, k, v, True) - r).max())
            err["no split"] = max(err["no split"], np.abs(flash(q, k, v, False) - r).max())
        print(f"T {T} hd {d} |x| <= {x}: largest error: naive bf16 {err['naive']:.2e}, "
              f"split {err['split']:.2e}, no split {err['no split']:.2e} "
              f"(no split / naive {err['no split'] / err['naive']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
