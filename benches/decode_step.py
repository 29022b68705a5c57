"""Decode-step benchmark input: a Llama-style decoder with a static KV cache
large enough that copying it shows (tests/fixtures/generate_state.py's
TinyLlama at dim 256, 4 heads, 2 layers, 2048 positions: four 2 MiB caches),
exported (Core ATen) with N single-token decode steps for `kiln run --steps`.

    /work/torchvenv/bin/python benches/decode_step.py OUT [--steps 64]
    kiln compile OUT/aten.pt2 -o OUT/decode.kiln
    kiln run OUT/decode.kiln --steps OUT/steps --output-dir OUT/out --json

Random weights; only the timing matters (correctness of the same model at
fixture size is tests/tests/e2e/state.rs's tiny_llama).
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
from generate_state import TinyLlama  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--max-seq", type=int, default=2048)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = TinyLlama(vocab=256, dim=256, heads=4, layers=2, max_seq=args.max_seq).eval()
    os.makedirs(args.out, exist_ok=True)
    token, pos = torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    ep = torch.export.export(model, (token, pos)).run_decompositions()
    torch.export.save(ep, os.path.join(args.out, "aten.pt2"))
    for k in range(args.steps):
        d = os.path.join(args.out, "steps", f"step_{k}")
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "input_0.npy"), np.array([[k % 256]], dtype=np.int64))
        np.save(os.path.join(d, "input_1.npy"), np.array([k], dtype=np.int64))


if __name__ == "__main__":
    main()
