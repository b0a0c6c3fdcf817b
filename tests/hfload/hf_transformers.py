"""tests/hfload/hf_transformers.py: load a --save DIR export with transformers itself and
compare its loss with the training program's (where torch and transformers are installed).

    python3 hf_transformers.py DIR TOKENS GBS T LOSS

AutoModelForCausalLM.from_pretrained(DIR) in float64 must find every weight (no missing,
unexpected or mismatched keys but the tied head), and the mean cross-entropy of the first GBS
samples of TOKENS (sample j: tokens[j*T : j*T+T+1], as tests/hfload/hf_ref.py reads them) must
be LOSS, the program's first-step loss, within 1e-5 relative (the program computes in float32).
"""
import struct
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM


def read_tokens(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) >= 1024 and struct.unpack("<i", raw[:4])[0] == 20240520:
        n = struct.unpack("<i", raw[8:12])[0]
        raw = raw[1024:1024 + 2 * n]
    return list(struct.unpack("<%dH" % (len(raw) // 2), raw))


def main():
    d, tokens, gbs, T, want = (sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                               float(sys.argv[5]))
    model, info = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float64,
                                                       output_loading_info=True)
    model.eval()
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    bad = {k: info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")
           if set(map(str, info.get(k, []))) - tied}
    if bad or info.get("error_msgs"):
        sys.exit("%s: transformers did not load every weight: %r" % (d, info))
    tok = read_tokens(tokens)
    batch = torch.tensor([tok[j * T:j * T + T + 1] for j in range(gbs)])
    with torch.no_grad():
        logits = model(input_ids=batch[:, :-1]).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)).item()
    print("%s: transformers %s loss %.9f, the program's %.9f" %
          (d, type(model).__name__, loss, want))
    if abs(loss - want) > 1e-5 * abs(want):
        sys.exit("%s: the losses differ by more than 1e-5 relative" % d)


if __name__ == "__main__":
    main()
