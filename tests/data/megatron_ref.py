#!/usr/bin/env python3
"""tests/data/megatron_ref.py: the test oracle for lib/data.c, in NumPy.

  write PREFIX --dtype D --docs N --seed S --max-id V [--max-len L]
      a Megatron indexed dataset (PREFIX.bin + PREFIX.idx, the MMIDIDX version-1 layout) of N
      documents of random lengths (1 to L tokens, a few longer than a sample) and random ids
      in [0, V), dtype D (uint8, int8, int16, int32, int64, uint16); plain Python
  sample --seq T --samples N --seed S --dump K [--split A,B,C --which SPLIT] WORDS...
      the first K samples (T + 1 ids each, "sample I: ids") of the dataset that Megatron's
      GPTDataset (WORDS = PREFIX) or BlendedDataset (WORDS = W1 P1 W2 P2 ..., or P1 P2 ...
      without weights) gives for N samples of sequence length T and seed S: the "train" split
      over the whole corpus, or with --split the split SPLIT (train, valid, test) of each
      dataset's documents, bounded as Megatron's builder bounds them. An independent
      implementation: NumPy's own RandomState, plain loops.
  bounds A,B,C N
      the documents of the three splits of N documents: "train [lo, hi), valid ..., test none"

Used by tests/data/suite.sh, which compares its output with `train --dump-samples K`.
"""
import math
import random
import re
import struct
import sys

# dtype name: Megatron's code, struct's format letter, bytes
DTYPES = {"uint8": (1, "B", 1), "int8": (2, "b", 1), "int16": (3, "h", 2), "int32": (4, "i", 4),
          "int64": (5, "q", 8), "uint16": (8, "H", 2)}


def write(prefix, dtype, docs, seed, max_id, max_len):
    """Plain Python (no NumPy), so that the suite's training and error tests need none."""
    code, fmt, width = DTYPES[dtype]
    rng = random.Random(seed)
    lengths = [rng.randint(1, max_len) for _ in range(docs)]
    for _ in range(max(1, docs // 10)):                         # a few long documents
        lengths[rng.randrange(docs)] = rng.randint(max_len, 4 * max_len)
    lengths[rng.randrange(docs)] = 1                            # and a one-token one
    pointers, at = [], 0
    with open(prefix + ".bin", "wb") as f:
        for n in lengths:
            f.write(struct.pack("<%d%s" % (n, fmt), *[rng.randrange(max_id) for _ in range(n)]))
            pointers.append(at)
            at += n * width
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<QBQQ", 1, code, docs, docs + 1))
        f.write(struct.pack("<%di" % docs, *lengths))
        f.write(struct.pack("<%dq" % docs, *pointers))
        f.write(struct.pack("<%dq" % (docs + 1), *range(docs + 1)))


class Indexed:
    """PREFIX.bin + PREFIX.idx, read with NumPy."""

    def __init__(self, prefix):
        raw = open(prefix + ".idx", "rb").read()
        assert raw[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<Q", raw[9:17])[0] == 1
        self.dtype = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
                      8: np.uint16}[raw[17]]
        nseq, _ = struct.unpack("<QQ", raw[18:34])
        self.lengths = np.frombuffer(raw, np.int32, nseq, 34)
        self.pointers = np.frombuffer(raw, np.int64, nseq, 34 + 4 * nseq)
        self.bin = np.memmap(prefix + ".bin", dtype=np.uint8, mode="r")

    def get(self, seq, offset, length):
        width = np.dtype(self.dtype).itemsize
        start = int(self.pointers[seq]) + offset * width
        return np.frombuffer(self.bin[start:start + length * width].tobytes(), self.dtype)


class GPT:
    """GPTDataset over every sequence: document, sample and shuffle indices; __getitem__."""

    def __init__(self, ds, num_samples, seq, seed, docs=None):
        self.ds, self.seq = ds, seq
        lo, hi = docs if docs else (0, len(ds.lengths))
        per_epoch_tokens = int(np.sum(ds.lengths[lo:hi]))
        epochs = 1
        if num_samples is not None:
            while epochs * per_epoch_tokens < num_samples * seq + 1:
                epochs += 1
        separate = False
        if epochs > 1:
            sans = ((epochs - 1) * per_epoch_tokens - 1) // seq
            per_epoch = (per_epoch_tokens - 1) // seq
            separate = num_samples - sans < int(0.80 * per_epoch)
        rs = np.random.RandomState(seed)
        docs = np.arange(lo, hi, dtype=np.int32)
        if separate:
            first = np.tile(docs, epochs - 1)
            rs.shuffle(first)
            last = docs.copy()
            rs.shuffle(last)
            self.doc = np.concatenate([first, last])
        else:
            self.doc = np.tile(docs, epochs)
            rs.shuffle(self.doc)
        # walk the flattened documents: sample k starts where sample k - 1's last token is
        count = (epochs * per_epoch_tokens - 1) // seq
        starts = [(0, 0)]
        di, off = 0, 0
        for _ in range(count):
            need = seq + 1
            while True:
                left = int(ds.lengths[self.doc[di]]) - off
                if left >= need:
                    off += need - 1
                    break
                need -= left
                if di == len(self.doc) - 1:
                    off = int(ds.lengths[self.doc[di]]) - 1
                    break
                di, off = di + 1, 0
            starts.append((di, off))
        self.sample = starts
        if separate:
            a = np.arange(0, sans, dtype=np.int64)
            rs.shuffle(a)
            b = np.arange(sans, count, dtype=np.int64)
            rs.shuffle(b)
            self.shuffle = np.concatenate([a, b])
        else:
            self.shuffle = np.arange(count, dtype=np.int64)
            rs.shuffle(self.shuffle)

    def __len__(self):
        return len(self.shuffle)

    def __getitem__(self, i):
        j = int(self.shuffle[i])
        (b, bo), (e, eo) = self.sample[j], self.sample[j + 1]
        parts = []
        for k in range(b, e + 1):
            seq = int(self.doc[k])
            lo = bo if k == b else 0
            hi = int(self.ds.lengths[seq]) if k < e else eo + 1
            parts.append(self.ds.get(seq, lo, hi - lo))
        out = np.concatenate(parts).astype(np.int64)
        assert len(out) == self.seq + 1
        return out


def normalize(w):
    w = np.array(w, dtype=np.float64)
    return (w / np.sum(w)).tolist()


class Blend:
    """BlendedDataset: each sample from the dataset furthest behind its weight."""

    def __init__(self, datasets, weights, size):
        weights = normalize(weights)
        self.datasets = datasets
        self.which, self.within = [], []
        taken = [0] * len(datasets)
        for i in range(size):
            x = max(float(i), 1.0)
            errors = [w * x - taken[k] for k, w in enumerate(weights)]
            k = errors.index(max(errors))          # the first of the largest
            self.which.append(k)
            self.within.append(taken[k])
            taken[k] += 1
        assert all(taken[k] <= len(d) for k, d in enumerate(datasets))

    def __len__(self):
        return len(self.which)

    def __getitem__(self, i):
        return self.datasets[self.which[i]][self.within[i]]


def split_bounds(text, n):
    """Megatron's split: any numbers in the text, three (zeros added), normalised; bounds the
    running sums times n, rounded by Python's round; a zero share: no split (None)."""
    shares = [float(x) for x in re.findall(r"[.0-9]+", text)]
    shares += [0.0] * (3 - len(shares))
    shares = normalize(shares)
    ends = [0]
    for f in shares:
        ends.append(ends[-1] + f)
    out = []
    for k in range(3):
        if ends[k + 1] <= ends[k]:
            out.append(None)
        else:
            out.append((int(round(ends[k] * float(n))), int(round(ends[k + 1] * float(n)))))
    return out


def build(words, num_samples, seq, seed, split=None, which=0):
    def gpt(prefix, n):
        ds = Indexed(prefix)
        docs = split_bounds(split, len(ds.lengths))[which] if split else None
        assert docs is None or docs[1] > docs[0]
        return GPT(ds, n, seq, seed, docs)
    if len(words) == 1:
        return gpt(words[0], num_samples)
    weights = None
    if len(words) % 2 == 0:
        try:
            weights = [float(w) for w in words[0::2]]
            words = words[1::2]
        except ValueError:
            weights = None
    if weights is None:           # one epoch of each, blended by their lengths
        parts = [gpt(p, None) for p in words]
        return Blend(parts, [len(p) for p in parts], min(num_samples, sum(map(len, parts))))
    weights = normalize(weights)
    target = [int(math.ceil(num_samples * w)) for w in weights]
    built = [int(math.ceil(math.ceil(num_samples * w) * (1 + 0.005))) for w in weights]
    parts = [gpt(p, n) for p, n in zip(words, built)]
    return Blend(parts, weights, sum(target))


def main(argv):
    if argv[0] == "write":
        opts = dict(zip(argv[2::2], argv[3::2]))
        write(argv[1], opts["--dtype"], int(opts["--docs"]), int(opts["--seed"]),
              int(opts["--max-id"]), int(opts.get("--max-len", "100")))
        return
    global np
    import numpy as np
    if argv[0] == "bounds":
        names = ("train", "valid", "test")
        print(", ".join("%s %s" % (n, "none" if b is None else "[%d, %d)" % b)
                        for n, b in zip(names, split_bounds(argv[1], int(argv[2])))))
        return
    opts, words, i = {"--split": None, "--which": "train"}, [], 1
    while i < len(argv):
        if argv[i] in ("--split", "--which"):
            opts[argv[i]] = argv[i + 1]
            i += 2
        elif argv[i].startswith("--"):
            opts[argv[i]] = int(argv[i + 1])
            i += 2
        else:
            words.append(argv[i])
            i += 1
    data = build(words, opts["--samples"], opts["--seq"], opts["--seed"], opts["--split"],
                 ["train", "valid", "test"].index(opts["--which"]))
    out = []
    for i in range(opts["--dump"]):
        out.append("sample %d: %s" % (i, " ".join(str(int(t)) for t in data[i])))
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
