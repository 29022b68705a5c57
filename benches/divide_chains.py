#!/usr/bin/env python3
"""The `native_divide` fixture's model (tests/fixtures/generate_extras.py:
DivideChains — i64 `//`, `%`, trunc division and fmod, the same on i32,
f32 remainder / fmod / floor_divide chains) at benchmark size: 2^20 ids and
divisors, 1024 × 1024 floats. Writes OUT/divide_chains/{aten.pt2,
input_N.npy} (OUT: target/bench-models unless given) for benches/native.py:

    /path/to/venv/bin/python benches/divide_chains.py [OUT]
    python3 benches/native.py --models divide_chains [--dir OUT]
"""
import os
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from generate_extras import DivideChains  # noqa: E402


def main():
    base = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "target" / "bench-models"
    out = base / "divide_chains"
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(16)
    n = 1 << 20
    d = torch.randint(1, 1000, (n,), generator=g, dtype=torch.int64)
    args = (
        torch.randn(1024, 1024, generator=g) * 100.0,
        torch.randn(1024, 1024, generator=g) + 3.0,
        torch.randint(-(1 << 40), 1 << 40, (n,), generator=g, dtype=torch.int64),
        torch.where(torch.rand(n, generator=g) > 0.5, d, -d),
    )
    ep = torch.export.export(DivideChains().eval(), args).run_decompositions()
    torch.export.save(ep, os.path.join(out, "aten.pt2"))
    for i, a in enumerate(args):
        np.save(os.path.join(out, f"input_{i}.npy"), a.numpy())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
