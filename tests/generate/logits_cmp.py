#!/usr/bin/env python3
"""logits_cmp.py A B V TOL: compare two files of logits rows (V per row) written by generate
(--logits: f32) or by the reference (gpt2_ref --gen-logits: f64, named *.f64). Every element must satisfy |a - b| <= TOL * max(1, max |b| of its row). Prints
the largest such relative difference; exits 1 (saying where) if one is above TOL or the
shapes differ. Standard library only."""
import struct
import sys


def rows(path, v):
    data = open(path, "rb").read()
    size, code = (8, "d") if path.endswith(".f64") else (4, "f")
    if len(data) % (size * v):
        sys.exit("%s: %d bytes is no whole number of rows of %d" % (path, len(data), v))
    n = len(data) // size
    vals = struct.unpack("<%d%s" % (n, code), data)
    return [vals[i:i + v] for i in range(0, n, v)]


def main():
    a_path, b_path, v, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    a, b = rows(a_path, v), rows(b_path, v)
    if len(a) != len(b):
        print("%s has %d rows, %s has %d" % (a_path, len(a), b_path, len(b)))
        return 1
    worst, where = 0.0, (0, 0)
    for r, (ra, rb) in enumerate(zip(a, b)):
        scale = max(1.0, max(abs(x) for x in rb))
        for c, (x, y) in enumerate(zip(ra, rb)):
            d = abs(x - y) / scale
            if d > worst or d != d:
                worst, where = d, (r, c)
    print("max relative difference %.3g (row %d, column %d)" % (worst, where[0], where[1]))
    return 0 if worst <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
