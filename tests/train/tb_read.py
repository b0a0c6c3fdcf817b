#!/usr/bin/env python3
"""tests/train/tb_read.py: read TensorBoard event files as TensorBoard does, written here from
the record and message formats alone (TFRecord framing with masked CRC-32C; tensorflow.Event,
Summary, Summary.Value, SessionLog as protocol buffers), to check lib/tboard.c independently.

    tb_read.py FILE...    one line per scalar: "step tag value" (value as the float it holds);
                          "version V" for the file_version event, "start STEP" for a SessionLog
                          START. Exits 1 naming the first bad record (length, CRC, encoding).
"""
import struct
import sys


def crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fields(buf):
    """(field number, wire type, value) of a protocol buffer message; value: int or bytes."""
    i = 0
    while i < len(buf):
        k, i = varint(buf, i)
        num, wire = k >> 3, k & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wire)
        if i > len(buf):
            raise ValueError("field %d runs past the message" % num)
        yield num, wire, v


def varint(buf, i):
    v, shift = 0, 0
    while True:
        if i >= len(buf):
            raise ValueError("varint runs past the message")
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def event(data, out):
    step, wall = 0, None
    for num, wire, v in fields(data):
        if num == 1 and wire == 1:
            wall = struct.unpack("<d", v)[0]
        elif num == 2 and wire == 0:
            step = v
    if wall is None:
        raise ValueError("no wall_time")
    for num, wire, v in fields(data):
        if num == 3:
            out.append("version %s" % v.decode())
        elif num == 6:
            status = dict((n, x) for n, _, x in fields(v)).get(1)
            if status == 1:
                out.append("start %d" % step)
        elif num == 5:
            for vn, _, value in fields(v):
                if vn != 1:
                    continue
                tag, x = None, None
                for n, w, y in fields(value):
                    if n == 1:
                        tag = y.decode()
                    elif n == 2 and w == 5:
                        x = struct.unpack("<f", y)[0]
                if tag is None or x is None:
                    raise ValueError("a Summary.Value without tag or simple_value")
                out.append("%d %s %.9g" % (step, tag, x))


def main(paths):
    for path in paths:
        raw = open(path, "rb").read()
        i, k = 0, 0
        while i < len(raw):
            if len(raw) - i < 12:
                sys.exit("%s: record %d: %d bytes left, a header needs 12" % (path, k, len(raw) - i))
            n = struct.unpack("<Q", raw[i:i + 8])[0]
            if masked(crc32c(raw[i:i + 8])) != struct.unpack("<I", raw[i + 8:i + 12])[0]:
                sys.exit("%s: record %d: the length's CRC is wrong" % (path, k))
            data = raw[i + 12:i + 12 + n]
            if len(data) != n or len(raw) < i + 16 + n:
                sys.exit("%s: record %d: cut short" % (path, k))
            if masked(crc32c(data)) != struct.unpack("<I", raw[i + 12 + n:i + 16 + n])[0]:
                sys.exit("%s: record %d: the data's CRC is wrong" % (path, k))
            out = []
            try:
                event(data, out)
            except ValueError as e:
                sys.exit("%s: record %d: %s" % (path, k, e))
            for line in out:
                print(line)
            i += 16 + n
            k += 1


if __name__ == "__main__":
    main(sys.argv[1:])
