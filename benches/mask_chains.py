#!/usr/bin/env python3
"""The `native_masks` fixture's model (tests/fixtures/generate_extras.py:
MaskChains — i64 comparisons into a causal | padding mask, masked_fill(-inf)
and softmax, a bool input masking features and cast to float, i64 index
arithmetic) at benchmark size: 8 heads of 512 positions, 512 × 1024
features. Writes target/bench-models/mask_chains/{aten.pt2, input_N.npy}
for benches/native.py:

    /path/to/venv/bin/python benches/mask_chains.py
    python3 benches/native.py --models mask_chains
"""
import os
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from generate_extras import MaskChains  # noqa: E402


def main():
    out = ROOT / "target" / "bench-models" / "mask_chains"
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(14)
    t = 512
    args = (
        torch.randn(1, 8, t, t, generator=g),
        torch.randn(t, 1024, generator=g),
        torch.arange(t, dtype=torch.int64),
        torch.tensor(400, dtype=torch.int64),
        torch.rand(t, generator=g) > 0.3,
    )
    ep = torch.export.export(MaskChains().eval(), args).run_decompositions()
    torch.export.save(ep, os.path.join(out, "aten.pt2"))
    for i, a in enumerate(args):
        np.save(os.path.join(out, f"input_{i}.npy"), a.numpy())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
