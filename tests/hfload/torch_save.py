# tests/hfload/torch_save.py: write a BF16 safetensors file from PyTorch tensors laid out as
# Hugging Face's save_pretrained writes one (tests/hfload/suite.sh, when torch is installed).
# Reads an F32 safetensors file with plain struct/json, makes each tensor a torch tensor, casts
# it to torch.bfloat16 and writes IN's tensors plus GPT-2's non-parameter buffers
# (h.{i}.attn.bias, h.{i}.attn.masked_bias) the way the safetensors library lays them out:
# {"__metadata__": {"format": "pt"}} first, tensors sorted by dtype (widest first) then name,
# compact JSON, the header padded with spaces to a multiple of 8, data in header order.
#
#   python3 torch_save.py IN OUT
import json
import struct
import sys

import torch

WIDTH = {"F32": 4, "BF16": 2, "BOOL": 1}        # bytes per element: the sort's dtype order


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", f"{name}: {e['dtype']}, expected F32"
        b, end = e["data_offsets"]
        data = raw[8 + hlen + b:8 + hlen + end]
        values = struct.unpack(f"<{len(data) // 4}f", data)
        out[name] = torch.tensor(values, dtype=torch.float32).reshape(e["shape"])
    return out


def tensor_bytes(t):
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
    if t.dtype == torch.bool:
        return t.contiguous().to(torch.uint8).numpy().tobytes()
    return t.contiguous().numpy().astype("<f4").tobytes()


def dtype_name(t):
    return {torch.bfloat16: "BF16", torch.float32: "F32", torch.bool: "BOOL"}[t.dtype]


def main():
    src, dst = sys.argv[1], sys.argv[2]
    tensors = {name: t.to(torch.bfloat16) for name, t in read(src).items()}
    T = tensors["wpe.weight"].shape[0]
    layers = sum(1 for name in tensors if name.endswith(".ln_1.weight"))
    for i in range(layers):     # the buffers of GPT2Attention, as older checkpoints hold them
        tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(T, T, dtype=torch.bool))[None, None]
        tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4, dtype=torch.float32)
    order = sorted(tensors, key=lambda n: (-WIDTH[dtype_name(tensors[n])], n))
    header, data, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name in order:
        b = tensor_bytes(tensors[name])
        header[name] = {"dtype": dtype_name(tensors[name]), "shape": list(tensors[name].shape),
                        "data_offsets": [at, at + len(b)]}
        data.append(b)
        at += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(data))


if __name__ == "__main__":
    main()
