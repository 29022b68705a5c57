#!/usr/bin/env python3
"""Dynamic-shape and strides/views conformance cases for kiln.

Run by hand (never in CI), from the repository root:

    /root/torchvenv/bin/python tests/conformance/generate_dynamic.py                # every case
    /root/torchvenv/bin/python tests/conformance/generate_dynamic.py --cases cat_two_syms,slice_neg_end

Two sections, one manifest (`dynamic/manifest.json`):

- `dynamic`: small modules exported with `torch.export.Dim` bounds (compound
  size expressions such as `2*s0`, `s0 + 1`, `s0 // 2`, `s0 + s1`, and two
  independent symbols included). Each is saved in both IR flavours and run
  eagerly at 2-3 sizes, the export example first, the bounds' minimum and
  maximum among them; `reject/` holds inputs with a dimension outside its
  bounds, which kiln's runtime must refuse.
- `views`: static programs that create non-contiguous tensors themselves
  (transposes, expand, as_strided, negative dims, zero-size and 0-d tensors,
  Python scalars as tensors); one size each.

Each case folder `dynamic/<name>/` holds:

    training.pt2, aten.pt2    torch.export.export(...) and .run_decompositions()
    size_K/input_N.npy        inputs of the K-th size (contiguous)
    size_K/output_N.npy       eager outputs
    reject/input_N.npy        (dynamic cases) an out-of-bounds size

The conformance test (`tests/tests/e2e/conformance_dynamic.rs`) compiles each
flavour once and runs every size through one session. KNOWN_UNSUPPORTED marks
flavours kiln is expected to fail, with the reason.
"""
import argparse
import os
import shutil
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim
from torch.utils import _pytree as pytree

# Shared with the per-op generator next to this file (importing it runs nothing).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate import close, graph_targets, kept_entries, strip_sample_inputs, write_manifest  # noqa: E402

torch.set_num_threads(1)
warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))

# (case, flavour or "*") -> why kiln is expected to fail it.
KNOWN_UNSUPPORTED = {
}

CASES = []


def case(name, section="dynamic"):
    """Registers `fn() -> dict(module, make, sizes, dyn, reject)` under `name`."""
    def wrap(fn):
        CASES.append((name, section, fn))
        return fn
    return wrap


def rnd(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def ints(high, *shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g)


class Fn(nn.Module):
    """Wraps a function of the inputs (and of optional parameters)."""

    def __init__(self, fn, **params):
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            if isinstance(v, nn.Module):
                setattr(self, k, v)
            else:
                self.register_buffer(k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


def lin(i, o, seed):
    torch.manual_seed(seed)
    return nn.Linear(i, o)


# ----------------------------------------------------------------------------------------------
# Dynamic shapes. `make(**sizes)` builds the inputs; `sizes[0]` is the export example (never 0 or
# 1: torch specialises those); `reject` is a size outside the bounds.
# ----------------------------------------------------------------------------------------------
B = dict(min=1, max=16)


@case("add_broadcast")
def _():
    b = Dim("b", **B)
    return dict(module=Fn(lambda m, x, y, z: (x + y) * z - 1.5), make=lambda b: (rnd(b, 8, seed=b), rnd(8, seed=1), rnd(b, 1, seed=2)),
                dyn=({0: b}, None, {0: b}), sizes=[dict(b=3), dict(b=1), dict(b=16)], reject=dict(b=17))


@case("outer_two_syms")
def _():
    m, n = Dim("m", min=2, max=9), Dim("n", min=1, max=12)
    return dict(module=Fn(lambda _, x, y: torch.sigmoid(x * y) + x), make=lambda m, n: (rnd(m, 1, seed=m), rnd(1, n, seed=n)),
                dyn=({0: m}, {1: n}), sizes=[dict(m=4, n=5), dict(m=2, n=1), dict(m=9, n=12)], reject=dict(m=10, n=5))


@case("unary_3d")
def _():
    b, s = Dim("b", **B), Dim("s", min=2, max=10)
    return dict(module=Fn(lambda _, x: F.gelu(x) * torch.tanh(x) + torch.exp(-x.abs())), make=lambda b, s: (rnd(b, s, 6, seed=s),),
                dyn=({0: b, 1: s},), sizes=[dict(b=2, s=3), dict(b=1, s=2), dict(b=16, s=10)], reject=dict(b=2, s=11))


@case("linear_seq")
def _():
    b, s = Dim("b", **B), Dim("s", min=1, max=12)
    return dict(module=Fn(lambda m, x: F.relu(m.l1(x)) @ m.w, l1=lin(8, 6, 1), w=rnd(6, 5, seed=3)),
                make=lambda b, s: (rnd(b, s, 8, seed=b + s),), dyn=({0: b, 1: s},),
                sizes=[dict(b=2, s=3), dict(b=1, s=1), dict(b=16, s=12)], reject=dict(b=17, s=3))


@case("bmm_two_syms")
def _():
    m, n = Dim("m", min=1, max=8), Dim("n", min=1, max=8)
    return dict(module=Fn(lambda _, x, y: torch.bmm(x, y)), make=lambda m, n: (rnd(2, m, 5, seed=m), rnd(2, 5, n, seed=n)),
                dyn=({1: m}, {2: n}), sizes=[dict(m=3, n=4), dict(m=1, n=8), dict(m=8, n=1)], reject=dict(m=3, n=9))


@case("conv2d_batch")
def _():
    b = Dim("b", **B)
    torch.manual_seed(4)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    return dict(module=Fn(lambda m, x: F.max_pool2d(F.relu(m.conv(x)), 2).flatten(1), conv=conv),
                make=lambda b: (rnd(b, 3, 6, 6, seed=b),), dyn=({0: b},), sizes=[dict(b=2), dict(b=1), dict(b=16)], reject=dict(b=17))


@case("conv1d_length")
def _():
    l = Dim("l", min=5, max=20)
    torch.manual_seed(5)
    conv = nn.Conv1d(2, 3, 3, stride=2)
    return dict(module=Fn(lambda m, x: m.conv(x), conv=conv), make=lambda l: (rnd(2, 2, l, seed=l),), dyn=({2: l},),
                sizes=[dict(l=9), dict(l=5), dict(l=20)], reject=dict(l=21))


@case("avg_pool1d_half")
def _():
    l = Dim("l", min=4, max=20)
    return dict(module=Fn(lambda _, x: F.avg_pool1d(x, 2)), make=lambda l: (rnd(2, 3, l, seed=l),), dyn=({2: l},),
                sizes=[dict(l=7), dict(l=4), dict(l=20)], reject=dict(l=3))


@case("pool2d_batch")
def _():
    b = Dim("b", **B)
    return dict(module=Fn(lambda _, x: (F.avg_pool2d(x, 2), F.adaptive_avg_pool2d(x, 1))), make=lambda b: (rnd(b, 2, 4, 4, seed=b),),
                dyn=({0: b},), sizes=[dict(b=3), dict(b=1), dict(b=16)], reject=dict(b=17))


@case("reductions")
def _():
    b, s = Dim("b", **B), Dim("s", min=2, max=10)
    return dict(module=Fn(lambda _, x: (x.sum(1), x.mean(-1), x.amax(dim=(0, 1)), x.argmax(1), x.var(1, keepdim=True))),
                make=lambda b, s: (rnd(b, s, 5, seed=b * s),), dyn=({0: b, 1: s},),
                sizes=[dict(b=3, s=4), dict(b=1, s=2), dict(b=16, s=10)], reject=dict(b=3, s=1))


@case("softmax_dyn_axis")
def _():
    b, s = Dim("b", **B), Dim("s", min=1, max=10)
    return dict(module=Fn(lambda _, x: (torch.softmax(x, -1), torch.log_softmax(x, 1))), make=lambda b, s: (rnd(b, 3, s, seed=s),),
                dyn=({0: b, 2: s},), sizes=[dict(b=2, s=5), dict(b=1, s=1), dict(b=16, s=10)], reject=dict(b=2, s=11))


@case("layer_norm")
def _():
    b, s = Dim("b", **B), Dim("s", min=1, max=12)
    torch.manual_seed(6)
    ln = nn.LayerNorm(8)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    return dict(module=Fn(lambda m, x: m.ln(x), ln=ln), make=lambda b, s: (rnd(b, s, 8, seed=b + 3 * s),), dyn=({0: b, 1: s},),
                sizes=[dict(b=2, s=3), dict(b=1, s=1), dict(b=16, s=12)], reject=dict(b=17, s=3))


class Attention(nn.Module):
    def __init__(self, causal):
        super().__init__()
        torch.manual_seed(7)
        self.qkv, self.out, self.causal = nn.Linear(8, 24), nn.Linear(8, 8), causal

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, s, 8))


@case("attention_seq")
def _():
    b, s = Dim("b", min=1, max=4), Dim("s", min=1, max=16)
    return dict(module=Attention(False), make=lambda b, s: (rnd(b, s, 8, seed=s),), dyn=({0: b, 1: s},),
                sizes=[dict(b=2, s=5), dict(b=1, s=1), dict(b=4, s=16)], reject=dict(b=2, s=17))


@case("attention_causal")
def _():
    s = Dim("s", min=2, max=16)
    return dict(module=Attention(True), make=lambda s: (rnd(2, s, 8, seed=s),), dyn=({1: s},),
                sizes=[dict(s=6), dict(s=2), dict(s=16)], reject=dict(s=17))


@case("attention_mask_kv_len")
def _():
    lq, lk = Dim("lq", min=1, max=8), Dim("lk", min=1, max=12)
    return dict(module=Fn(lambda _, q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)),
                make=lambda lq, lk: (rnd(2, lq, 4, seed=1), rnd(2, lk, 4, seed=2), rnd(2, lk, 3, seed=3), ints(2, lq, lk, seed=4).bool() | (torch.arange(lk) == 0)),
                dyn=({1: lq}, {1: lk}, {1: lk}, {0: lq, 1: lk}), sizes=[dict(lq=3, lk=5), dict(lq=1, lk=1), dict(lq=8, lk=12)],
                reject=dict(lq=3, lk=13))


@case("reshape_merge")
def _():
    b, s = Dim("b", **B), Dim("s", min=1, max=10)
    return dict(module=Fn(lambda _, x: x.view(x.shape[0], x.shape[1], 2, 4).permute(0, 2, 1, 3).reshape(-1, 4) * 2),
                make=lambda b, s: (rnd(b, s, 8, seed=s),), dyn=({0: b, 1: s},),
                sizes=[dict(b=2, s=3), dict(b=1, s=1), dict(b=16, s=10)], reject=dict(b=2, s=11))


@case("flatten_view_all")
def _():
    b = Dim("b", **B)
    return dict(module=Fn(lambda _, x: (x.flatten(1), x.view(-1), x.transpose(0, 1).flatten())),
                make=lambda b: (rnd(b, 2, 3, seed=b),), dyn=({0: b},), sizes=[dict(b=4), dict(b=1), dict(b=16)], reject=dict(b=17))


@case("expand_dyn")
def _():
    b, s = Dim("b", **B), Dim("s", min=1, max=10)
    return dict(module=Fn(lambda _, x, y: x.expand(-1, y.shape[1], -1) + y), make=lambda b, s: (rnd(b, 1, 4, seed=1), rnd(b, s, 4, seed=s)),
                dyn=({0: b}, {0: b, 1: s}), sizes=[dict(b=2, s=3), dict(b=1, s=1), dict(b=16, s=10)], reject=dict(b=2, s=11))


@case("slice_ends")
def _():
    s = Dim("s", min=4, max=12)
    return dict(module=Fn(lambda _, x: (x[:, 1:], x[:, :-1], x[:, 1:-1] * 2, x[:, -2:])),
                make=lambda s: (rnd(2, s, seed=s),), dyn=({1: s},), sizes=[dict(s=5), dict(s=4), dict(s=12)], reject=dict(s=3))


@case("slice_step_half")
def _():
    s = Dim("s", min=4, max=13)
    return dict(module=Fn(lambda _, x: (x[:, ::2], x[:, 1::2], x[:, ::3])), make=lambda s: (rnd(3, s, seed=s),), dyn=({1: s},),
                sizes=[dict(s=7), dict(s=4), dict(s=13)], reject=dict(s=14))


@case("slice_sym_end")
def _():
    a, b = Dim("a", min=2, max=10), Dim("b", min=1, max=9)
    return dict(module=Fn(lambda _, x, y: x[:, : y.shape[0]] + 1),
                make=lambda a, b: (rnd(2, a, seed=a), rnd(b, seed=b)), dyn=({1: a}, {0: b}),
                sizes=[dict(a=6, b=4), dict(a=2, b=1), dict(a=10, b=9)], reject=dict(a=11, b=4))


@case("select_negative")
def _():
    b, s = Dim("b", **B), Dim("s", min=2, max=10)
    return dict(module=Fn(lambda _, x: (x[:, -1], x[:, 0], x[-1], x.narrow(1, 1, 1))), make=lambda b, s: (rnd(b, s, 3, seed=s),),
                dyn=({0: b, 1: s},), sizes=[dict(b=2, s=4), dict(b=1, s=2), dict(b=16, s=10)], reject=dict(b=2, s=11))


@case("cat_two_syms")
def _():
    a, b = Dim("a", min=1, max=8), Dim("b", min=1, max=8)
    return dict(module=Fn(lambda _, x, y: torch.cat([x, y * 2], 1).softmax(1)), make=lambda a, b: (rnd(2, a, seed=a), rnd(2, b, seed=10 + b)),
                dyn=({1: a}, {1: b}), sizes=[dict(a=3, b=4), dict(a=1, b=8), dict(a=8, b=1)], reject=dict(a=9, b=1))


@case("cat_double_plus_one")
def _():
    s = Dim("s", min=1, max=10)
    return dict(module=Fn(lambda m, x: (torch.cat([x, x], 0), torch.cat([m.w, x], 0), x.repeat(2, 1)), w=rnd(1, 3, seed=9)),
                make=lambda s: (rnd(s, 3, seed=s),), dyn=({0: s},), sizes=[dict(s=4), dict(s=1), dict(s=10)], reject=dict(s=11))


@case("derived_double")
def _():
    d = Dim("d", min=2, max=8)
    return dict(module=Fn(lambda _, x: x.view(-1, 2, 3).sum(1)), make=lambda d: (rnd(2 * d, 3, seed=d),), dyn=({0: 2 * d},),
                sizes=[dict(d=3), dict(d=2), dict(d=8)], reject=dict(d=9))


@case("derived_plus_one")
def _():
    d = Dim("d", min=2, max=10)
    return dict(module=Fn(lambda _, x, y: x[1:] * y), make=lambda d: (rnd(d + 1, 3, seed=d), rnd(d, 3, seed=d + 1)), dyn=({0: d + 1}, {0: d}),
                sizes=[dict(d=4), dict(d=2), dict(d=10)], reject=dict(d=11))


@case("numel_as_number")
def _():
    # x.numel() of a dynamic tensor: training IR calls aten.sym_numel (Core
    # ATen rewrites it to a product of sym_size).
    b, c = Dim("b", **B), Dim("c", min=2, max=8)
    return dict(module=Fn(lambda _, x: x * x.numel() + x.shape[1]),
                make=lambda b, c: (rnd(b, c, seed=b + c),), dyn=({0: b, 1: c},),
                sizes=[dict(b=3, c=4), dict(b=1, c=2), dict(b=16, c=8)], reject=dict(b=17, c=4))


@case("split_chunk")
def _():
    b = Dim("b", **B)
    return dict(module=Fn(lambda _, x: (*x.split([2, 4], 1), *x.chunk(3, 1), *torch.split(x, 4, 1))),
                make=lambda b: (rnd(b, 6, seed=b),), dyn=({0: b},), sizes=[dict(b=3), dict(b=1), dict(b=16)], reject=dict(b=17))


@case("split_dyn_axis")
def _():
    s = Dim("s", min=4, max=12)
    def f(_, x):
        head, rest = x.split([2, x.shape[1] - 2], 1)
        return head * x[:, -1:], rest.sum(1)
    return dict(module=Fn(f), make=lambda s: (rnd(3, s, seed=s),), dyn=({1: s},),
                sizes=[dict(s=5), dict(s=4), dict(s=12)], reject=dict(s=13))


@case("gather_family")
def _():
    n = Dim("n", min=1, max=20)
    torch.manual_seed(10)
    emb = nn.Embedding(10, 4)
    return dict(module=Fn(lambda m, x, i: (m.emb(i), x.index_select(0, i.flatten()), torch.gather(x, 1, i.clamp(max=2))), emb=emb),
                make=lambda n: (rnd(10, 3, seed=1), ints(10, 10, n, seed=n)),
                dyn=(None, {1: n}), sizes=[dict(n=3), dict(n=1), dict(n=20)], reject=dict(n=21))


@case("embedding_batch_seq")
def _():
    b, s = Dim("b", **B), Dim("s", min=1, max=12)
    torch.manual_seed(8)
    emb = nn.Embedding(11, 4)
    return dict(module=Fn(lambda m, i: m.emb(i) + m.pos[: i.shape[1]], emb=emb, pos=rnd(12, 4, seed=12)),
                make=lambda b, s: (ints(11, b, s, seed=s),), dyn=({0: b, 1: s},),
                sizes=[dict(b=2, s=5), dict(b=1, s=1), dict(b=16, s=12)], reject=dict(b=2, s=13))


@case("arange_full")
def _():
    s, t = Dim("s", min=1, max=10), Dim("t", min=3, max=6)
    return dict(module=Fn(lambda _, x, y: (torch.arange(x.shape[0]) * 2, torch.full((x.shape[0], y.shape[0]), 1.5),
                                            torch.zeros(x.shape[0] + 1, 2), torch.ones_like(x) + torch.arange(x.shape[0], dtype=torch.float32).unsqueeze(1),
                                            torch.arange(1, y.shape[0] + 1, 2))),
                make=lambda s, t: (rnd(s, 3, seed=s), rnd(t, seed=t)), dyn=({0: s}, {0: t}),
                sizes=[dict(s=4, t=4), dict(s=1, t=3), dict(s=10, t=6)], reject=dict(s=4, t=7))


@case("triu_mask_from_arange")
def _():
    s = Dim("s", min=1, max=12)
    def f(_, x):
        n = x.shape[1]
        i = torch.arange(n)
        return x.masked_fill(i[None, :] > i[:, None], float("-inf")).softmax(-1)
    return dict(module=Fn(f), make=lambda s: (rnd(s, s, seed=s),), dyn=({0: s, 1: s},), sizes=[dict(s=5), dict(s=1), dict(s=12)], reject=dict(s=13))


@case("pad_dyn")
def _():
    s = Dim("s", min=3, max=10)
    return dict(module=Fn(lambda _, x: (F.pad(x, (1, 2)), F.pad(x, (2, 1), mode="reflect"), F.pad(x, (0, 0, 1, 1), value=-1.0))),
                make=lambda s: (rnd(2, 3, s, seed=s),), dyn=({2: s},), sizes=[dict(s=4), dict(s=3), dict(s=10)], reject=dict(s=11))


@case("where_broadcast")
def _():
    b, s = Dim("b", **B), Dim("s", min=1, max=10)
    return dict(module=Fn(lambda _, x, y: (torch.where(x > 0, x, y), torch.where(y > 0, 1.0, x), x.clamp(-0.5, 0.5))),
                make=lambda b, s: (rnd(b, s, seed=s), rnd(s, seed=b)), dyn=({0: b, 1: s}, {0: s}),
                sizes=[dict(b=2, s=4), dict(b=1, s=1), dict(b=16, s=10)], reject=dict(b=17, s=4))


@case("cumsum_dyn")
def _():
    b, s = Dim("b", **B), Dim("s", min=1, max=12)
    return dict(module=Fn(lambda _, x, i: (x.cumsum(1), x.cumsum(0), i.cumsum(-1))), make=lambda b, s: (rnd(b, s, seed=s), ints(5, b, s, seed=b)),
                dyn=({0: b, 1: s}, {0: b, 1: s}), sizes=[dict(b=3, s=4), dict(b=1, s=1), dict(b=16, s=12)], reject=dict(b=3, s=13))


@case("sort_topk_batch")
def _():
    b = Dim("b", **B)
    return dict(module=Fn(lambda _, x: (*torch.topk(x, 3, 1), torch.sort(x, 1)[0])), make=lambda b: (rnd(b, 7, seed=b),),
                dyn=({0: b},), sizes=[dict(b=3), dict(b=1), dict(b=16)], reject=dict(b=17))


@case("sym_size_scalar")
def _():
    s = Dim("s", min=1, max=10)
    return dict(module=Fn(lambda _, x: (x / x.shape[1], x.sum(1) / x.shape[1] + x.shape[0])),
                make=lambda s: (rnd(3, s, seed=s),), dyn=({1: s},), sizes=[dict(s=4), dict(s=1), dict(s=10)], reject=dict(s=11))


@case("interp_batch")
def _():
    b = Dim("b", **B)
    return dict(module=Fn(lambda _, x: (F.interpolate(x, scale_factor=2, mode="nearest"), F.interpolate(x, size=(5, 3), mode="bilinear"))),
                make=lambda b: (rnd(b, 2, 3, 4, seed=b),), dyn=({0: b},), sizes=[dict(b=2), dict(b=1), dict(b=16)], reject=dict(b=17))


@case("group_norm_dyn")
def _():
    b, h, w = Dim("b", **B), Dim("h", min=2, max=8), Dim("w", min=2, max=8)
    torch.manual_seed(10)
    gn = nn.GroupNorm(2, 4)
    with torch.no_grad():
        gn.weight.uniform_(0.5, 1.5)
        gn.bias.uniform_(-0.5, 0.5)
    return dict(module=Fn(lambda m, x: (m.gn(x), F.group_norm(x.flatten(2), 4)), gn=gn),
                make=lambda b, h, w: (rnd(b, 4, h, w, seed=b + h * w) * 3 + 1,), dyn=({0: b, 2: h, 3: w},),
                sizes=[dict(b=2, h=3, w=5), dict(b=1, h=2, w=2), dict(b=16, h=8, w=8), dict(b=3, h=7, w=2)], reject=dict(b=2, h=9, w=3))


@case("diff_dyn")
def _():
    s = Dim("s", min=4, max=12)
    return dict(module=Fn(lambda _, x, p: (torch.diff(x, dim=1), torch.diff(x, n=2, dim=-1), torch.diff(x > 0, dim=1),
                                           torch.diff(x, dim=1, prepend=p), torch.diff(x, dim=0))),
                make=lambda s: (rnd(3, s, seed=s) * 4, rnd(3, 2, seed=1)), dyn=({1: s}, None),
                sizes=[dict(s=6), dict(s=4), dict(s=12), dict(s=9)], reject=dict(s=3))


@case("diagonal_dyn")
def _():
    # Square diagonals (torch states a non-square one's length as a Min of sizes, which kiln's
    # dimensions cannot express); s >= 3 keeps the +-1 diagonals longer than 1, as torch requires.
    b, s = Dim("b", min=1, max=6), Dim("s", min=3, max=10)
    return dict(module=Fn(lambda _, x, y: (x.diagonal(), x.diagonal(1), x.diagonal(-1) * 2, y.diagonal(0, 1, 2), y.diagonal(-1, -1, -2),
                                           y.diagonal(1, 1, 2))),
                make=lambda b, s: (rnd(s, s, seed=s), rnd(b, s, s, seed=b + s)), dyn=({0: s, 1: s}, {0: b, 1: s, 2: s}),
                sizes=[dict(b=2, s=4), dict(b=1, s=3), dict(b=6, s=10), dict(b=3, s=7)], reject=dict(b=2, s=11))


@case("scatter_neg_index_dyn")
def _():
    s = Dim("s", min=3, max=10)
    return dict(module=Fn(lambda _, x, y, z: (torch.select_scatter(x, y, 0, -1), torch.slice_scatter(x, z, 0, -2),
                                              torch.select_scatter(x, y, 0, -3), torch.slice_scatter(x, z, 0, -3, -1))),
                make=lambda s: (rnd(s, 3, seed=s), rnd(3, seed=2), rnd(2, 3, seed=3)), dyn=({0: s}, None, None),
                sizes=[dict(s=5), dict(s=3), dict(s=10), dict(s=4)], reject=dict(s=2))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(9)
        self.ln1, self.ln2 = nn.LayerNorm(8), nn.LayerNorm(8)
        self.att = Attention(True)
        self.ff = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    def forward(self, x):
        x = x + self.att(self.ln1(x))
        return x + self.ff(self.ln2(x))


@case("transformer_block")
def _():
    b, s = Dim("b", min=1, max=4), Dim("s", min=2, max=16)
    return dict(module=Block(), make=lambda b, s: (rnd(b, s, 8, seed=b * s),), dyn=({0: b, 1: s},),
                sizes=[dict(b=2, s=5), dict(b=1, s=2), dict(b=4, s=16)], reject=dict(b=5, s=5))


# ----------------------------------------------------------------------------------------------
# Strides and views: static programs that make non-contiguous, zero-size or 0-d tensors.
# ----------------------------------------------------------------------------------------------
def static(module, *inputs):
    return dict(module=module, make=lambda: inputs, dyn=None, sizes=[dict()], reject=None)


@case("t_matmul", "views")
def _():
    return static(Fn(lambda _, x, y: (x.t() @ y, x.t().contiguous() + 1, y.t() @ x)), rnd(4, 3, seed=1), rnd(4, 5, seed=2))


@case("transpose_elementwise", "views")
def _():
    return static(Fn(lambda _, x, y: (x.transpose(0, 1) * y, (x.transpose(0, 1) + y).mT.sum(-1))), rnd(2, 3, 4, seed=1), rnd(3, 2, 4, seed=2))


@case("expand_elementwise", "views")
def _():
    return static(Fn(lambda _, x, y: (x.expand(4, 3, 5) + y, x.expand_as(y) * y, x.unsqueeze(0).expand(2, -1, -1, -1).sum(0))),
                  rnd(3, 1, seed=1), rnd(4, 3, 5, seed=2))


@case("as_strided", "views")
def _():
    return static(Fn(lambda _, x: (x.as_strided((3, 3), (1, 3)) + 0, torch.as_strided(x, (2, 2), (2, 1), 1) * 2,
                                   x.as_strided((2, 3), (0, 1)) + 1)), rnd(3, 3, seed=3))


@case("negative_dims", "views")
def _():
    return static(Fn(lambda _, x: (x.sum(-1), x.softmax(-2), x.transpose(-1, -2), torch.cat([x, x], -1), x.unsqueeze(-1),
                                   x.flip(-1), x.cumsum(-2), x.amax(-3), x.movedim(-1, 0))), rnd(2, 3, 4, seed=4))


@case("negative_index", "views")
def _():
    return static(Fn(lambda _, x: (x[..., -1], x[-2], x[:, -3:-1], x.unbind(-1)[2], x.narrow(-1, -2, 2))), rnd(2, 3, 4, seed=5))


@case("zero_size_input", "views")
def _():
    return static(Fn(lambda _, x, y: (x + 1, x.sum(0), x.sum(1), torch.cat([x, y], 0), x.t() @ x, x.mean(1))),
                  rnd(0, 4, seed=1), rnd(3, 4, seed=2))


@case("zero_size_slice", "views")
def _():
    return static(Fn(lambda _, x: (x[:, 2:2], x[:, 2:2].sum(1), x[:, 5:], torch.cat([x[:, :0], x], 1), x[:, :0] @ x[:0, :])), rnd(3, 4, seed=6))


@case("zero_size_matmul", "views")
def _():
    return static(Fn(lambda _, x, y: (x @ y, torch.zeros(0, 3) + 1, x.new_zeros(0))), rnd(3, 0, seed=1), rnd(0, 4, seed=2))


@case("zero_d_input", "views")
def _():
    return static(Fn(lambda _, s, x: (s * x, s + 1, x / s, s.expand(2, 3), torch.where(x > s, x, s))), torch.tensor(0.5), rnd(3, seed=7))


@case("zero_d_output", "views")
def _():
    return static(Fn(lambda _, x: (x.sum(), x.max(), x[1, 2], x.mean() + x.min(), x.argmax())), rnd(3, 4, seed=8))


@case("scalar_tensors", "views")
def _():
    return static(Fn(lambda _, x, i: (torch.tensor(3.0) * x, x + 2, i * 2.5, i + 2, i // 2, x * torch.tensor(2, dtype=torch.int64),
                                      torch.scalar_tensor(1.5) + i, torch.full((), 4.0) - x)),
                  rnd(2, 3, seed=9), ints(7, 2, 3, seed=9))


@case("zero_d_int_scalars", "views")
def _():
    return static(Fn(lambda _, n, x: (x * n, n + 1, n.float() / 3, (x > n).sum())), torch.tensor(3), ints(6, 4, seed=2))


@case("permute_reshape_copy", "views")
def _():
    return static(Fn(lambda _, x: (x.permute(2, 0, 1).reshape(4, 6), x.transpose(0, 1).flatten(), x.permute(1, 2, 0).contiguous().view(-1, 2))),
                  rnd(2, 3, 4, seed=10))


@case("strided_slices", "views")
def _():
    return static(Fn(lambda _, x: (x[::2, 1::3], x[1:, ::2].t(), x[::3].flip(0), x[:, 1:4:2] + x[:, 0:3:2])), rnd(6, 7, seed=11))


@case("inplace_on_views", "views")
def _():
    def f(_, x):
        y = x.clone()
        y[:, 0] = 0.0
        y[1:, 1:3] += 1.0
        y.t()[2].mul_(2.0)
        return y
    return static(Fn(f), rnd(3, 4, seed=12))


@case("inplace_view_chain", "views")
def _():
    def f(_, x, v, i, w):
        y = x.clone()
        z = y.t()[1:4]       # a slice of a transpose
        z[:, 0] = v          # copy_ through select -> slice -> t
        z[i] = w             # index_put_ through slice -> t
        z[1:, 2:] *= 2.0     # mul_ through slice -> slice -> (the index_put_'s result) -> slice -> t
        return y, z
    return static(Fn(f), rnd(4, 5, seed=15), rnd(3, seed=16), torch.tensor([2, 0]), rnd(2, 4, seed=17))


@case("inplace_reshape_views", "views")
def _():
    def f(_, x):
        y = x.clone()
        w = y[:, 1::2]                   # views made before the writes, read after them
        r = y.view(3, 8)
        v = y.view(2, 12)
        v.add_(1.0)                      # add_ through a reshape view
        y.unsqueeze(0)[0, 2].mul_(3.0)   # unsqueeze -> select -> select
        r[1].sub_(0.5)                   # through another reshape view
        c = y.t().reshape(24)            # torch copies here (strides): the write stays in `c`
        c.add_(100.0)
        return y, w, r, v.sum(1), c
    return static(Fn(f), rnd(4, 6, seed=18))


@case("inplace_diagonal", "views")
def _():
    def f(_, x):
        y = x.clone()
        d = y.diagonal(0, 1, 2)             # read after the writes below
        y[0].diagonal().fill_(1.0)
        y.diagonal(1, -2, -1).add_(10.0)
        y.transpose(0, 2).diagonal(-1).sub_(100.0)
        y.mul_(2.0)
        return y, d
    return static(Fn(f), rnd(2, 4, 4, seed=19))


@case("diagonal_unfold", "views")
def _():
    return static(Fn(lambda _, x: (x.diagonal(), x.diagonal(1), x.diagonal(0, -2, -1) * 2, x[None], x[:, None, :, None].squeeze(-1))),
                  rnd(4, 4, seed=13))


@case("expand_zero_d", "views")
def _():
    return static(Fn(lambda _, s, x: (s.expand(3, 4) * x, s.reshape(1, 1).expand(2, 5), s.unsqueeze(0) + x[0])), torch.tensor(1.25), rnd(3, 4, seed=14))


@case("broadcast_chain", "views")
def _():
    return static(Fn(lambda _, a, b, c: (a + b + c, torch.where(a > 0, b, c), torch.maximum(a, c) * b)),
                  rnd(4, 1, 1, seed=1), rnd(3, 1, seed=2), rnd(1, 5, seed=3))


# ----------------------------------------------------------------------------------------------


def to_numpy(t):
    return t.detach().contiguous().numpy()


def flat(out):
    outs, _ = pytree.tree_flatten(out)
    return [o.detach().clone().contiguous() for o in outs]


def range_constraints(ep):
    return {str(k): [int(v.lower), None if v.upper > 2**62 else int(v.upper)] for k, v in ep.range_constraints.items()}


def input_shapes(ep):
    users = set(ep.graph_signature.user_inputs)
    return [[str(d) for d in n.meta["val"].shape] for n in ep.graph.nodes if n.op == "placeholder" and n.name in users]


def build(name, section, spec, out_root):
    module = spec["module"].eval()
    sizes = spec["sizes"]
    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    example = tuple(spec["make"](**sizes[0]))
    dyn = spec["dyn"]
    with torch.no_grad():
        # `Fn.forward(*xs)`: the inputs are one (varargs) parameter.
        shapes = (dyn,) if isinstance(module, Fn) and dyn is not None else dyn
        ep = torch.export.export(module, example, dynamic_shapes=shapes)
    aten = ep.run_decompositions()
    flavours = ["training", "aten"]
    for flavour, prog in (("training", ep), ("aten", aten)):
        for node in prog.graph.nodes:  # provenance only: keeps the committed files small
            node.meta.pop("from_node", None)
        p = os.path.join(d, f"{flavour}.pt2")
        torch.export.save(prog, p)
        strip_sample_inputs(p)
    shapes = []
    for k, sz in enumerate(sizes):
        inputs = tuple(spec["make"](**sz))
        with torch.no_grad():
            want = flat(module(*inputs))
            for flavour, prog in (("training", ep), ("aten", aten)):
                got = flat(prog.module()(*inputs))
                if len(got) != len(want) or not all(close(g, w) for g, w in zip(got, want)):
                    raise RuntimeError(f"{name}: torch's own {flavour} program disagrees with eager at {sz}")
        sd = os.path.join(d, f"size_{k}")
        os.makedirs(sd)
        for i, t in enumerate(inputs):
            np.save(os.path.join(sd, f"input_{i}.npy"), to_numpy(t))
        for i, t in enumerate(want):
            np.save(os.path.join(sd, f"output_{i}.npy"), to_numpy(t))
        shapes.append({"sizes": sz, "inputs": [list(t.shape) for t in inputs], "outputs": [list(t.shape) for t in want]})
    entry = {
        "name": name,
        "section": section,
        "flavours": flavours,
        "sizes": shapes,
        "aten_ops": graph_targets(aten),
        "training_ops": graph_targets(ep),
    }
    if dyn is not None:
        entry["range_constraints"] = range_constraints(ep)
        entry["input_dims"] = input_shapes(ep)
    if spec.get("reject"):
        inputs = tuple(spec["make"](**spec["reject"]))
        rd = os.path.join(d, "reject")
        os.makedirs(rd)
        for i, t in enumerate(inputs):
            np.save(os.path.join(rd, f"input_{i}.npy"), to_numpy(t))
        entry["reject"] = {"sizes": spec["reject"], "inputs": [list(t.shape) for t in inputs]}
    marks = {f: KNOWN_UNSUPPORTED[k] for f in flavours for k in ((name, f), (name, "*")) if k in KNOWN_UNSUPPORTED}
    if marks:
        entry["unsupported"] = marks
    return entry


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "dynamic"))
    ap.add_argument("--cases", default="", help="comma-separated case names to regenerate")
    args = ap.parse_args()
    only = set(filter(None, args.cases.split(",")))
    os.makedirs(args.out, exist_ok=True)
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = kept_entries(manifest_path, only, "name", ("cases", "failed"))
    for name, section, fn in CASES:
        if only and name not in only:
            continue
        torch.manual_seed(0)
        try:
            entry = build(name, section, fn(), args.out)
        except Exception as e:  # noqa: BLE001 - a case torch itself cannot export is recorded, not fatal
            msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
            print(f"{name}: FAILED {msg}", file=sys.stderr)
            shutil.rmtree(os.path.join(args.out, name), ignore_errors=True)
            manifest["failed"].append({"name": name, "why": msg})
            continue
        manifest["cases"].append(entry)
        print(f"{name}: {len(entry['sizes'])} sizes, dims {entry.get('input_dims', '-')}", file=sys.stderr)
    manifest["cases"].sort(key=lambda c: (c["section"], c["name"]))
    manifest["torch"] = torch.__version__
    write_manifest(manifest_path, manifest)


if __name__ == "__main__":
    main()
