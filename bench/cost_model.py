#!/usr/bin/env python3
"""bench/cost_model.py: what one GPT-2 training step on one GPU should cost, kernel by kernel.

    bench/cost_model.py [124m|1558m] [--attn cudnn|own] [--profile LOG] [--bw TB/s]
                        [--flops TFLOP/s]

For GPT-2 124M (micro-batch 64) or 1558M (micro-batch 8, selective recompute), T = 1024, bf16
activations, f32 weights, gradients and Adam moments, it lists every launch of a step as the
CUDA library makes it (lib/kernels_cuda.cu, cuBLAS for the linear layers, cuBLASLt's epilogues
for the biases, the GELU and its gradient: on one GPU every bias is added in its product), with
its bytes moved (each operand read once, each result written once), its FLOPs and its launch
shape. It turns them into times at the stated rates, the larger of bytes / bandwidth and
FLOPs / matrix rate, plus LAUNCH_US per launch. The defaults are what the H200's first device
session measured: 4.29 TB/s for a copy and 784 TFLOP/s for a bf16 GEMM (docs/GPU.md). The launches are summed per
kernel family, the families of bench/step_profile.c. With --profile, the family times of a
measured profile (gpu_batch.sh's profile part: lines "profile: <family> <ms> <percent>") are
printed beside the prediction, with the ratio measured / predicted. That ratio shows where a
kernel is far from its floor.

Two columns are predicted. "as built" counts what the kernels do today: with --attn own, our
attention's 9 m16n8k16 passes per tile pair (dq recomputing the scores and their gradients);
with --attn cudnn (the default, as the programs run where cuDNN loads), cuDNN's fused graphs at
FlashAttention-2's 7 passes, the row sums of dout * out inside the backward (an assumption:
cuDNN's kernels are not ours to read); and the fused cross-entropy's two reads of the logits
(the second counted from memory). "floor" is the same step with FlashAttention-2's 7 passes and
one read of the logits. MFU counts 6N + 6LCT FLOPs per token against 989 TFLOP/s, as the batch
does.
"""
import argparse
import sys

LAUNCH_US = 4.0            # a kernel launch and its tail on an idle GPU (an assumption)
PEAK_MFU = 989e12          # H100/H200 dense bf16 (datasheet), for MFU as gpu_batch.sh counts it

MODELS = {  # layers, hidden, heads, micro-batch, recompute of the attention core
    "124m": dict(L=12, C=768, H=12, B=64, recompute=False),
    "1558m": dict(L=48, C=1600, H=25, B=8, recompute=True),
}
T, V = 1024, 50257
MT_TENSORS = 24            # tensors per launch of the multi-tensor kernels (lib/kernels.h)
A, W = 2, 4                # bytes: bf16 activation, f32 weight / gradient / moment


class Step:
    def __init__(self, bw, flops):
        self.bw, self.rate = bw, flops
        # (family, name, bytes, flops, launches, floor_flops, floor_bytes)
        self.rows = []

    def add(self, fam, name, nbytes, nflops=0.0, launches=1, floor_flops=None, floor_bytes=None):
        self.rows.append((fam, name, nbytes, nflops, launches,
                          nflops if floor_flops is None else floor_flops,
                          nbytes if floor_bytes is None else floor_bytes))

    def ms(self, row, floor=False):
        nbytes, nflops = (row[6], row[5]) if floor else (row[2], row[3])
        return max(nbytes / self.bw, nflops / self.rate) * 1e3 + row[4] * LAUNCH_US * 1e-3


def gemm(s, name, m, n, k, out_bytes=A, count=1, extra=0):
    """A linear layer's product: m x k by k x n, bf16 in, out_bytes out (f32 weight gradients);
    extra: the bytes its cuBLASLt epilogue moves besides (a bias, the GELU's aux matrix)"""
    for _ in range(count):
        s.add("gemm", name, (m * k + k * n) * A + m * n * out_bytes + extra, 2.0 * m * n * k)


def step_of(model, bw, flops, attn="cudnn"):
    L, C, H, B, rc = model["L"], model["C"], model["H"], model["B"], model["recompute"]
    N, hd = B * T, C // H
    s = Step(bw, flops)
    # attention: one causal product = 2 B H (T^2 / 2) hd FLOPs; our forward does 2 (S, P V),
    # the backward 7 (dk/dv: S, dP, dV, dK; dq: S, dP, dQ)
    unit = 2.0 * B * H * T * T / 2 * hd
    att_io = N * 3 * C * A + N * C * A + B * H * T * 4
    for _ in range(L):
        s.add("layernorm", "layernorm_fwd", 2 * N * C * A + N * 8)
        # the column-parallel biases and the GELU in cuBLASLt's epilogues (rt_gemm_epi): the
        # bias read, the GELU's input written beside its output (aux), read again backward
        gemm(s, "qkv + bias", N, 3 * C, C, extra=3 * C * A)
        for _ in range(2 if rc else 1):       # selective recompute repeats the core
            s.add("attention", "attention_fwd", att_io, 2 * unit)
        gemm(s, "attn proj + bias", N, C, C, extra=C * A)   # TP 1: the bias in the product
        # res1 = x + proj and ln_2 of res1, one kernel: reads x and proj, writes res1 and ln_2
        s.add("layernorm", "add_layernorm_fwd", 4 * N * C * A + N * 8)
        gemm(s, "fc + bias + gelu", N, 4 * C, C, extra=4 * C * A + N * 4 * C * A)
        gemm(s, "fc proj + bias", N, C, 4 * C, extra=C * A)
        s.add("residual", "add_fwd", 3 * N * C * A)
        # backward
        s.add("residual", "add_inplace", 3 * N * C * A)
        s.add("bias", "bias_bwd fc proj", N * C * A, launches=2)
        gemm(s, "fc proj dW", C, 4 * C, N, out_bytes=W)
        gemm(s, "fc proj dX * gelu'", N, 4 * C, C, extra=N * 4 * C * A)
        s.add("bias", "bias_bwd fc", N * 4 * C * A, launches=2)
        gemm(s, "fc dX", N, C, 4 * C)
        gemm(s, "fc dW", 4 * C, C, N, out_bytes=W)
        s.add("layernorm", "layernorm_bwd", 5 * N * C * A + N * 8, launches=3)
        s.add("residual", "add_inplace", 3 * N * C * A)
        s.add("bias", "bias_bwd proj", N * C * A, launches=2)
        gemm(s, "attn proj dX", N, C, C)
        gemm(s, "attn proj dW", C, C, N, out_bytes=W)
        if attn == "own":
            s.add("attention", "attention_dsum", 2 * N * C * A + B * H * T * 4)
            s.add("attention", "attention_bwd", att_io + N * C * A + N * 3 * C * A, 7 * unit,
                  2, floor_flops=5 * unit)
        else:   # cuDNN's graph: dsum inside it, FlashAttention-2's 5 products (an assumption)
            s.add("attention", "attention_bwd (cuDNN)",
                  att_io + 2 * N * C * A + N * 3 * C * A, 5 * unit)
        s.add("bias", "bias_bwd qkv", N * 3 * C * A, launches=2)
        gemm(s, "qkv dX", N, C, 3 * C)
        gemm(s, "qkv dW", 3 * C, C, N, out_bytes=W)
        s.add("layernorm", "layernorm_bwd", 5 * N * C * A + N * 8, launches=3)
    s.add("embedding", "embed_fwd + pos_fwd", N * C * A + 3 * N * C * A, launches=2)
    s.add("layernorm", "layernorm_fwd (final)", 2 * N * C * A + N * 8)
    gemm(s, "logits", N, V, C)
    logits = N * V * A
    # one GPU (TP 1): ce_fused reads a row for its maximum and sum, again for the gradient it
    # writes in place (the second read counted here from memory, though the row was just read
    # by the same block: it may come from L2), then sum_rows
    s.add("cross-entropy", "ce_fused, sum_rows", 3 * logits, launches=2,
          floor_bytes=2 * logits)
    gemm(s, "logits dX", N, C, V)
    gemm(s, "logits dW", V, C, N, out_bytes=W)
    s.add("layernorm", "layernorm_bwd (final)", 5 * N * C * A + N * 8, launches=3)
    # embed_bwd: the ids counted, scanned, the positions scattered and sorted (int traffic),
    # then blocks of a row's columns add its tokens' rows; pos_bwd
    s.add("embedding", "embed_bwd + pos_bwd", 2 * N * C * A + V * C * W * 2 + N * 4 * 8 + V * 4 * 4,
          launches=6)
    P = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    tensors = 12 * L + 4             # a layer's 12, wte, wpe, the final LayerNorm's 2
    # multi-tensor: per MT_TENSORS tensors, AdamW one launch (p g m v in, p m v and the bf16
    # copy out), the norm two
    calls = -(-tensors // MT_TENSORS)
    s.add("adamw", "adamw_multi", P * (4 * W + 3 * W + A), launches=calls)
    s.add("grad-norm", "sumsq_multi", P * W, launches=2 * calls)
    s.add("zero-grads", "rt_memset0", P * W)
    return s, P


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="124m", choices=sorted(MODELS))
    ap.add_argument("--profile", help="a profile log (profile: <family> <ms> <percent>)")
    ap.add_argument("--bw", type=float, default=4.29, help="TB/s (default: the H200's copy)")
    ap.add_argument("--flops", type=float, default=784.0,
                    help="TFLOP/s for bf16 products (default: the H200's 8192^3 GEMM)")
    ap.add_argument("--attn", default="cudnn", choices=["cudnn", "own"],
                    help="the attention (ATTN): cuDNN's fused graphs (default) or ours")
    a = ap.parse_args()
    m = MODELS[a.model]
    s, P = step_of(m, a.bw * 1e12, a.flops * 1e12, a.attn)
    measured = {}
    if a.profile:
        for line in open(a.profile):
            f = line.split()
            if len(f) == 4 and f[0] == "profile:" and f[1] != "other":
                try:
                    measured[f[1]] = float(f[2])
                except ValueError:
                    pass
    fams = []
    for r in s.rows:
        if r[0] not in fams:
            fams.append(r[0])
    launches = sum(r[4] for r in s.rows)
    print(f"GPT-2 {a.model}, B {m['B']}, T {T}, bf16, ATTN={a.attn}: {launches} launches per "
          f"step, at {a.bw} TB/s, {a.flops} TFLOP/s, {LAUNCH_US} us per launch")
    print(f"{'family':<14} {'launches':>8} {'GB':>8} {'TFLOP':>7} {'as built':>9} {'floor':>8}"
          + (f" {'measured':>9} {'meas/built':>10}" if measured else ""))
    tb = tf = tm = 0.0
    for fam in fams:
        rows = [r for r in s.rows if r[0] == fam]
        gb = sum(r[2] for r in rows) / 1e9
        tfl = sum(r[3] for r in rows) / 1e12
        built = sum(s.ms(r) for r in rows)
        floor = sum(s.ms(r, floor=True) for r in rows)
        tb, tf = tb + built, tf + floor
        n = sum(r[4] for r in rows)
        line = f"{fam:<14} {n:>8} {gb:>8.2f} {tfl:>7.2f} {built:>9.2f} {floor:>8.2f}"
        if measured:
            got = measured.get(fam)
            tm += got or 0.0
            line += (f" {got:>9.2f} {got / built:>10.2f}" if got is not None else f" {'-':>9}")
        print(line)
    tokens = m["B"] * T
    mfu = lambda ms: 100 * tokens / (ms / 1e3) * (6 * P + 6 * m["L"] * m["C"] * T) / PEAK_MFU
    tail = f" {tm:>9.2f} {tm / tb:>10.2f}" if measured else ""
    print(f"{'step':<14} {launches:>8} {'':>8} {'':>7} {tb:>9.2f} {tf:>8.2f}{tail}")
    print(f"MFU: as built {mfu(tb):.1f} %, floor {mfu(tf):.1f} %"
          + (f", measured {mfu(tm):.1f} % (synchronised calls)" if measured else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
