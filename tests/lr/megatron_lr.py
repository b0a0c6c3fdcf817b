#!/usr/bin/env python3
"""tests/lr/megatron_lr.py: the learning-rate schedule as Megatron-LM runs it, for tests/lr.

An independent implementation (standard library only) of what Megatron's training loop does
with its OptimizerParamScheduler in iteration-based training, written from the published
behaviour rather than from lib/lr.c or tests/ref: the scheduler is built with every length
in samples (iterations times the global batch size G), sets the rate once with 0 samples seen,
and after each optimizer step advances by G samples. So the rate of iteration t is the one for
(t - 1) * G samples. The rate's formula per style is Megatron's get_lr; the float operations are
done in the same order, so the doubles are Megatron's.

It takes the flags of our programs (their names and defaults: --min-lr 0.1*lr, --decay-steps
max(steps, warmup)), prints one rate per iteration, or with --log compares a JSONL log's "lr"
values with its own: exactly as float32 (--f32, a generated program, which passes the rate to
its step as a float) or as doubles (--f64, the reference). Prints the first mismatches and
exits 1 when any.

usage: megatron_lr.py --steps N --gbs G [--lr X] [--min-lr X] [--warmup N] [--decay-steps N]
                      [--lr-decay-style S] [--lr-warmup-init X] [--lr-wsd-decay-style S]
                      [--lr-wsd-decay-iters N] [--log FILE.jsonl (--f32 | --f64)]
"""
import argparse
import json
import math
import struct
import sys


class Scheduler:
    """Megatron's learning-rate scheduler: lengths in samples, rate set on every step()."""

    def __init__(self, init_lr, max_lr, min_lr, warmup, decay, style, wsd_decay=None,
                 wsd_style=None):
        assert 0.0 <= min_lr <= max_lr and init_lr <= max_lr
        assert decay > 0
        if style == "WSD":
            assert wsd_decay is not None
        self.init_lr, self.max_lr, self.min_lr = init_lr, float(max_lr), min_lr
        self.warmup, self.decay, self.style = warmup, decay, style
        self.wsd_decay, self.wsd_style = wsd_decay, wsd_style
        self.seen = 0
        self.step(0)                                      # the rate before any training

    def step(self, samples):
        self.seen += samples
        self.lr = self.rate()

    def rate(self):
        n, warm, decay = self.seen, self.warmup, self.decay
        if warm > 0 and n <= warm:                        # linear warm-up from init_lr
            return self.init_lr + (self.max_lr - self.init_lr) * float(n) / float(warm)
        if self.style == "constant":
            return self.max_lr
        if n > decay:
            return self.min_lr
        if self.style == "inverse-square-root":
            lr = self.max_lr * max(warm, 1) ** 0.5 / (max(n, 1) ** 0.5)
            return max(self.min_lr, lr)
        ratio = float(n - warm) / float(decay - warm)
        assert 0.0 <= ratio <= 1.0
        if self.style == "linear":
            coeff = 1.0 - ratio
        elif self.style == "cosine":
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        elif self.style == "WSD":
            start = decay - self.wsd_decay                # the anneal begins after `start`
            if n <= start:
                coeff = 1.0
            else:
                q = float(n - start) / float(self.wsd_decay)
                coeff = {"linear": lambda: 1.0 - q,
                         "cosine": lambda: 0.5 * (math.cos(math.pi * q) + 1.0),
                         "exponential": lambda: (2.0 * math.pow(0.5, q)) - 1.0,
                         "minus_sqrt": lambda: 1.0 - math.sqrt(q)}[self.wsd_style]()
        else:
            raise ValueError("unknown decay style %r" % self.style)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)


def schedule(a):
    """The rates of iterations 1..a.steps for our flags a, run as Megatron's loop runs them."""
    g = a.gbs
    decay = a.decay_steps if a.decay_steps is not None else max(a.steps, a.warmup)
    min_lr = a.min_lr if a.min_lr is not None else 0.1 * a.lr
    wsd = a.lr_wsd_decay_iters * g if a.lr_wsd_decay_iters is not None else None
    sched = Scheduler(a.lr_warmup_init, a.lr, min_lr, a.warmup * g, decay * g,
                      a.lr_decay_style, wsd, a.lr_wsd_decay_style)
    rates = []
    for _ in range(a.steps):
        rates.append(sched.lr)                            # the optimizer step uses this rate
        sched.step(g)                                     # then the scheduler advances
    return rates


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--gbs", type=int, required=True, help="global batch, in sequences")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--min-lr", type=float)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--decay-steps", type=int)
    p.add_argument("--lr-decay-style", default="cosine")
    p.add_argument("--lr-warmup-init", type=float, default=0.0)
    p.add_argument("--lr-wsd-decay-style", default="exponential")
    p.add_argument("--lr-wsd-decay-iters", type=int)
    p.add_argument("--log")
    p.add_argument("--f32", action="store_true")
    p.add_argument("--f64", action="store_true")
    a = p.parse_args(argv)
    rates = schedule(a)
    if not a.log:
        for r in rates:
            print("%.17g" % r)
        return 0
    if a.f32 == a.f64:
        p.error("--log needs one of --f32 and --f64")
    with open(a.log) as f:
        logged = [json.loads(line)["lr"] for line in f]
    if len(logged) != len(rates):
        print("%s: %d steps, want %d" % (a.log, len(logged), len(rates)))
        return 1
    bad = 0
    for t, (got, want) in enumerate(zip(logged, rates), 1):
        if a.f32:
            got, want = f32(got), f32(want)
        if got != want:
            bad += 1
            if bad <= 5:
                print("  step %d: lr %.17g, Megatron's %.17g" % (t, got, want))
    if bad:
        print("%s: %d of %d rates differ from Megatron's" % (a.log, bad, len(rates)))
        return 1
    print("%s: %d rates equal Megatron's (%s)" % (a.log, len(rates), "f32" if a.f32 else "f64"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
