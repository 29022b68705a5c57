#!/usr/bin/env python3
"""The five real-size models of the speed target (issue "Fast on the CPU"),
built with random weights and exported for benches/compare.py.

    /path/to/venv/bin/python benches/real_models.py [--out target/bench-models] [--models ...]

Needs torch, torchvision and transformers; never run in CI (the exported
programs are 10–50 MB each, so they are written under target/, not committed).
For every model it writes <out>/<model>/ with

    aten.pt2, training.pt2   the program after / before run_decompositions()
    input_N.npy              the example inputs (fixed seeds)

Sizes are the ones the issue measured: MLP 512-2048-2048-512 at batch 8,
ResNet-18 and MobileNetV2 at 224², a BERT-style encoder (4 layers × 256, 4
heads, seq 128) and a Llama-style decoder (4 layers × 512, 8 heads, 2 KV
heads — GQA — seq 64). EfficientNet-B0 and ConvNeXt-Tiny (224²) are the
elementwise-heavy CNNs of the native-code benchmark (benches/native.py);
MobileNetV3-Large (224²) is the hardswish CNN; `vit` (ViT-Tiny/16, 224²)
and `gpt2` (a GPT-2-style decoder, 6 layers × 384, seq 128) are the
transformer shapes the speed issue also names;
`elementwise` is that benchmark's group-only model (SiLU, GELU, log1p),
`rows` its row-kernel-only one (layer norm, RMS norm, softmax, mean).
"""
import argparse
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent


class HFOutputs(nn.Module):
    """Hugging Face models return ModelOutput objects; export plain tensors."""

    def __init__(self, model, fields):
        super().__init__()
        self.model, self.fields = model, fields

    def forward(self, *args):
        out = self.model(*args)
        return tuple(out[f] for f in self.fields)


def randn(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32)


def token_ids(b, t, seed, vocab):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (b, t), generator=g, dtype=torch.int64)


def mlp():
    model = nn.Sequential(
        nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 512))
    return model, (randn(8, 512, seed=1),)


def resnet18():
    import torchvision
    return torchvision.models.resnet18(), (randn(1, 3, 224, 224, seed=2),)


def mobilenet_v2():
    import torchvision
    return torchvision.models.mobilenet_v2(), (randn(1, 3, 224, 224, seed=3),)


def efficientnet_b0():
    import torchvision
    return torchvision.models.efficientnet_b0(), (randn(1, 3, 224, 224, seed=6),)


def mobilenet_v3_large():
    import torchvision
    return torchvision.models.mobilenet_v3_large(), (randn(1, 3, 224, 224, seed=11),)


def convnext_tiny():
    import torchvision
    return torchvision.models.convnext_tiny(), (randn(1, 3, 224, 224, seed=7),)


class Elementwise(nn.Module):
    """Only fused elementwise groups, at EfficientNet's first SiLU size: SiLU
    as exported (`x·σ(x)`), exact GELU with a residual, `log1p(|x|)·2`."""

    def forward(self, x):
        a = x * torch.sigmoid(x)
        b = torch.nn.functional.gelu(a) + x
        return torch.log1p(b.abs()) * 2.0


def elementwise():
    return Elementwise(), (randn(1, 32, 112, 112, seed=8),)


class Rows(nn.Module):
    """Only row kernels, at BERT-base sizes (8 × 128 tokens of 768): layer
    norm, RMS norm, softmax over a 128-wide attention row, a last-axis mean."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(768)
        self.rms = nn.RMSNorm(768, eps=1e-6)

    def forward(self, x, s):
        return self.rms(self.ln(x)), torch.softmax(s, dim=-1), x.mean(dim=-1)


def rows():
    return Rows(), (randn(8, 128, 768, seed=9), randn(8, 12, 128, 128, seed=10))


class RowEpilogues(nn.Module):
    """Row kernels each followed by an elementwise call on their result, at
    `rows`' sizes: layer norm → GELU + residual, softmax → scale + additive
    bias, RMS norm → per-channel scale, mean → rsqrt(· + ε): what native
    code merges into the row functions as epilogues."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(768)
        self.rms = nn.RMSNorm(768, eps=1e-6)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 768))

    def forward(self, x, s, b):
        h = F.gelu(self.ln(x)) + x
        p = torch.softmax(s, dim=-1) * 0.5 + b
        r = self.rms(x) * self.scale
        return h, p, r, torch.rsqrt(x.mean(dim=-1) + 1e-5)


def row_epilogues():
    return RowEpilogues(), (randn(8, 128, 768, seed=9), randn(8, 12, 128, 128, seed=10), randn(128, seed=12))


def bert():
    import transformers
    cfg = transformers.BertConfig(
        vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=1024, max_position_embeddings=128, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)
    model = HFOutputs(transformers.BertModel(cfg), ("last_hidden_state",))
    return model, (token_ids(1, 128, seed=4, vocab=1000),)


def llama():
    import transformers
    cfg = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, intermediate_size=1376, max_position_embeddings=128,
        use_cache=False, tie_word_embeddings=False)
    model = HFOutputs(transformers.LlamaForCausalLM(cfg), ("logits",))
    return model, (token_ids(1, 64, seed=5, vocab=1000),)


def vit():
    import torchvision
    # ViT-Tiny/16 (DeiT-Tiny's shape): 12 layers × 192, 3 heads, MLP 768, 224².
    model = torchvision.models.VisionTransformer(
        image_size=224, patch_size=16, num_layers=12, num_heads=3, hidden_dim=192, mlp_dim=768)
    nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision zeroes the head: logits would be 0
    return model, (randn(1, 3, 224, 224, seed=11),)


def gpt2():
    import transformers
    # GPT-2-style decoder (Conv1D projections, tanh GELU, learned positions,
    # causal attention): 6 layers × 384, 6 heads, seq 128.
    cfg = transformers.GPT2Config(
        vocab_size=1000, n_positions=256, n_embd=384, n_layer=6, n_head=6,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=0, eos_token_id=0)
    model = HFOutputs(transformers.GPT2LMHeadModel(cfg), ("logits",))
    return model, (token_ids(1, 128, seed=12, vocab=1000),)


MODELS = {"mlp": mlp, "resnet18": resnet18, "mobilenet_v2": mobilenet_v2, "bert": bert, "llama": llama,
          "efficientnet_b0": efficientnet_b0, "mobilenet_v3_large": mobilenet_v3_large,
          "convnext_tiny": convnext_tiny, "vit": vit, "gpt2": gpt2, "elementwise": elementwise, "rows": rows,
          "row_epilogues": row_epilogues}


def export(name, out: Path):
    torch.manual_seed(0)
    model, args = MODELS[name]()
    model.eval()
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        ep = torch.export.export(model, args)
        torch.export.save(ep, str(d / "training.pt2"))
        torch.export.save(ep.run_decompositions(), str(d / "aten.pt2"))
    for i, a in enumerate(args):
        np.save(d / f"input_{i}.npy", a.numpy())
    print(f"{name}: {d}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "target" / "bench-models")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in args.models:
        export(name, args.out)


if __name__ == "__main__":
    main()
