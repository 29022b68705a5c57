#!/usr/bin/env python3
"""Per-op conformance cases for kiln, from PyTorch's own OpInfo sample inputs.

Run by hand (never in CI), from the repository root:

    /root/torchvenv/bin/python tests/conformance/generate.py            # the committed subset
    /root/torchvenv/bin/python tests/conformance/generate.py --full --out /tmp/kiln-conf   # local, larger
    /root/torchvenv/bin/python tests/conformance/generate.py --ops cumsum,topk   # regenerate some ops

Needs torch (2.15) and `expecttest` (imported by torch's test helpers).

For every op in OPS and every dtype in DTYPES that PyTorch's CPU supports for
it (`OpInfo.supported_dtypes('cpu')`), it takes the op's sample inputs
(`op.sample_inputs('cpu', dtype)`), keeps the first small ones (total input
elements <= MAX_NUMEL, a few per dtype), wraps each in a tiny nn.Module that
calls the op, and writes into `cases/<op>/<dtype>_<n>/`:

    training.pt2   torch.export.export(...) as is (training IR); omitted when
                   its graph calls exactly the same ATen ops as aten.pt2
    aten.pt2       after .run_decompositions() (Core ATen)
    input_N.npy    the sample's tensors (contiguous); bf16 as raw '<u2' bits
    output_N.npy   eager outputs (flattened); bf16 as raw '<u2' bits

Samples that torch cannot export, or whose exported program disagrees with
eager, are skipped and recorded (with the reason) in manifest.json's
`skipped`. Each case in `cases` lists op, dtype, flavours and the ATen ops of
both graphs; KNOWN_UNSUPPORTED below marks cases kiln is expected to reject
(with the reason), copied into the case's `unsupported` field as
{flavour: reason}. Everything is deterministic (seeded, single thread).

The committed subset (the default mode) is COMMITTED's samples per dtype for
every op (f32 x2, bf16/i64/bool x1) plus, for the ops EXTRA_GROUPS lists, one
`<dtype>_0` sample in extra dtypes: f64/f16 for composites, legalized kernels
and reductions, i8/u8 for the wrapping/promotion/unsigned integer paths, i32/i16
for a few wide-integer ops, c64 (complex64 inputs and outputs) for the complex
ops kiln lowers onto (real, imaginary) pairs, c128 for the complex linear
algebra (c128 only there). It keeps training.pt2 for f32 and c64 cases only; running
it reproduces cases/ and manifest.json exactly (the .pt2 files may differ in
their `from_node` provenance graph ids). --full, --per-dtype N ignore
EXTRA_GROUPS (they cover every dtype); --dtypes and --ops filter it (with
--dtypes, only those dtypes' cases of the --ops are rewritten).

Beyond OpInfo: DIRECT calls the Core ATen overloads no sample reaches in an
exported graph (cases `aten.<overload>`, every dtype torch's CPU accepts,
training IR kept for every dtype), and COMPOSITE adds programs OpInfo leaves
out (einsum equations, FFT programs, erfinv over its whole domain, bincount
with a bounded length, quantiles of rows with NaNs, Bessel K over both
series' ranges, ndtri into both tails, Airy Ai across its three forms,
unique along dims on rows with repeats, segment_reduce without initial, igamma/igammac over all
their regimes, histc with
equal or point ranges and elements outside, empty_permuted written before
it is read, transformers::grouped_mm_fallback with an empty expert and rows
past the last offset; cases `<name>.extra`; inputs random in [-4, 5) unless
the entry gives a maker). topk cases carry a
`ties` entry: their indices are checked by what they select (see tie_order);
eigenvector and SVD cases a `signs` entry (see sign_groups).
The conformance test turns all runs into a Core ATen coverage table and fails
below 95 % (tests/src/coverage.rs).
"""
import argparse
import glob
import json
import os
import shutil
import sys
import warnings
import zipfile

import numpy as np
import torch
from torch.utils import _pytree as pytree

torch.set_num_threads(1)
warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))

# (OpInfo name, variant_test_name). Ordered: what kiln's IR had first, then additions.
OPS = [
    # elementwise unary
    ("abs", ""), ("neg", ""), ("exp", ""), ("log", ""), ("sqrt", ""), ("rsqrt", ""), ("reciprocal", ""),
    ("nn.functional.relu", ""), ("sigmoid", ""), ("tanh", ""), ("nn.functional.gelu", ""),
    ("nn.functional.silu", ""), ("erf", ""), ("sin", ""), ("cos", ""), ("floor", ""), ("ceil", ""),
    ("round", ""), ("sign", ""), ("logical_not", ""),
    # elementwise binary / ternary
    ("add", ""), ("sub", ""), ("mul", ""), ("rsub", ""), ("div", "no_rounding_mode"), ("div", "trunc_rounding"),
    ("div", "floor_rounding"), ("remainder", ""), ("floor_divide", ""), ("pow", ""), ("maximum", ""),
    ("minimum", ""), ("eq", ""), ("ne", ""), ("lt", ""), ("le", ""), ("gt", ""), ("ge", ""),
    ("logical_and", ""), ("logical_or", ""), ("logical_xor", ""), ("where", ""), ("masked_fill", ""),
    ("clamp", ""), ("clamp_min", ""), ("clamp_max", ""), ("nn.functional.hardtanh", ""), ("nn.functional.relu6", ""),
    # reductions
    ("sum", ""), ("mean", ""), ("amax", ""), ("amin", ""), ("prod", ""), ("any", ""), ("argmax", ""),
    ("max", "reduction_with_dim"), ("min", "reduction_with_dim"), ("softmax", ""), ("log_softmax", ""),
    # nn composites
    ("nn.functional.linear", ""), ("mm", ""), ("bmm", ""), ("matmul", ""), ("addmm", ""),
    ("nn.functional.conv1d", ""), ("nn.functional.conv2d", ""), ("nn.functional.batch_norm", ""),
    ("nn.functional.layer_norm", ""), ("nn.functional.max_pool2d", ""), ("nn.functional.avg_pool2d", ""),
    ("nn.functional.adaptive_avg_pool2d", ""), ("nn.functional.scaled_dot_product_attention", ""),
    # layout / indexing / creation
    ("reshape", ""), ("view", ""), ("flatten", ""), ("unsqueeze", ""), ("squeeze", ""), ("expand", ""),
    ("t", ""), ("transpose", ""), ("permute", ""), ("cat", ""), ("split", ""), ("chunk", ""), ("unbind", ""),
    ("narrow", ""), ("select", ""), ("index_select", ""), ("nn.functional.embedding", ""),
    ("full_like", ""), ("zeros_like", ""), ("ones_like", ""),
    # additions (issue 4)
    ("log1p", ""), ("expm1", ""), ("trunc", ""), ("tan", ""), ("sinh", ""), ("cosh", ""), ("asin", ""),
    ("acos", ""), ("atan", ""), ("asinh", ""), ("acosh", ""), ("atanh", ""), ("log2", ""), ("log10", ""),
    ("isnan", ""), ("isinf", ""), ("square", ""), ("atan2", ""), ("fmod", ""), ("bitwise_not", ""),
    ("nn.functional.hardswish", ""), ("nn.functional.hardsigmoid", ""), ("nn.functional.mish", ""),
    ("nn.functional.softplus", ""), ("nn.functional.leaky_relu", ""), ("nn.functional.elu", ""),
    ("argmin", ""), ("cumsum", ""), ("topk", ""), ("sort", ""), ("tril", ""), ("triu", ""), ("flip", ""),
    ("nonzero", ""),
    ("var", ""), ("std", ""), ("nn.functional.group_norm", ""), ("nn.functional.rms_norm", ""),
    ("constant_pad_nd", ""), ("nn.functional.pad", "constant"), ("nn.functional.pad", "reflect"),
    ("nn.functional.pad", "replicate"),
    ("nn.functional.interpolate", "nearest"), ("nn.functional.interpolate", "bilinear"),
    ("nn.functional.conv_transpose1d", ""), ("nn.functional.conv_transpose2d", ""),
    ("nn.functional.avg_pool1d", ""), ("nn.functional.max_pool1d", ""), ("einsum", ""),
    # index-driven ops (gather / scatter / advanced indexing)
    ("gather", ""), ("scatter", ""), ("scatter_add", ""), ("scatter_reduce", "sum"), ("scatter_reduce", "prod"),
    ("scatter_reduce", "mean"), ("scatter_reduce", "amax"), ("scatter_reduce", "amin"), ("index_put", ""),
    ("select_scatter", ""), ("slice_scatter", ""), ("diagonal", ""), ("as_strided", ""), ("masked_scatter", ""),
    ("nn.functional.avg_pool3d", ""), ("nn.functional.max_pool3d", ""), ("nn.functional.adaptive_avg_pool3d", ""),
    ("nn.functional.embedding_bag", ""), ("nn.functional.fold", ""),
    # the last Core ATen ops: training-mode batch norm, distances, grid sampling
    ("_native_batch_norm_legit", ""), ("cdist", ""),
    ("nn.functional.pdist", ""), ("nn.functional.grid_sample", ""),
    # composites real models keep in training IR (issue 4's list), and indexing reads
    ("nn.functional.conv3d", ""), ("nn.functional.interpolate", "linear"), ("nn.functional.interpolate", "trilinear"),
    ("nn.functional.interpolate", "area"), ("nn.functional.interpolate", "bicubic"),
    ("nn.functional.interpolate", "nearest-exact"), ("__getitem__", ""), ("masked_select", ""), ("argwhere", ""),
    ("take_along_dim", ""), ("nn.functional.unfold", ""), ("nn.functional.pixel_shuffle", ""),
    ("nn.functional.pixel_unshuffle", ""), ("index_add", ""), ("index_fill", ""), ("index_copy", ""),
    # what raw torch.export.export() (training IR) keeps (issue "coverage"): aliases and composites
    ("linalg.vector_norm", ""), ("nn.functional.normalize", ""), ("broadcast_to", ""), ("broadcast_tensors", ""),
    ("stack", ""), ("tile", ""), ("roll", ""), ("rot90", ""), ("true_divide", ""), ("logsumexp", ""),
    ("nn.functional.logsigmoid", ""), ("logaddexp", ""), ("nn.functional.selu", ""), ("nn.functional.prelu", ""),
    ("nn.functional.glu", ""), ("nan_to_num", ""), ("isfinite", ""), ("trace", ""), ("nn.functional.mse_loss", ""),
    ("nn.functional.l1_loss", ""), ("nn.functional.smooth_l1_loss", ""), ("exp2", ""), ("copysign", ""),
    ("hypot", ""), ("fmax", ""), ("fmin", ""), ("erfc", ""), ("cumprod", ""), ("tensordot", ""),
    ("logcumsumexp", ""), ("cummax", ""), ("cummin", ""),
    # torch.linalg (robot and control code): LU, Cholesky, triangular solves, QR, symmetric eigenvalues
    ("linalg.inv", ""), ("linalg.inv_ex", ""), ("linalg.det", ""), ("linalg.slogdet", ""), ("logdet", ""),
    ("linalg.solve", ""), ("linalg.solve_ex", ""), ("linalg.cholesky", ""), ("linalg.cholesky_ex", ""),
    ("linalg.solve_triangular", ""), ("cholesky_solve", ""), ("linalg.qr", ""), ("linalg.lu_factor", ""),
    ("linalg.lu_factor_ex", ""), ("linalg.eigvalsh", ""),
    # SVD-based and eigenvectors (vectors compared up to sign: see sign_groups)
    ("linalg.eigh", ""), ("linalg.svd", ""), ("svd", ""), ("linalg.svdvals", ""), ("linalg.pinv", ""),
    ("linalg.pinv", "singular"), ("linalg.pinv", "hermitian"), ("pinverse", ""), ("linalg.matrix_rank", ""),
    ("linalg.matrix_rank", "hermitian"), ("linalg.matrix_norm", ""), ("linalg.norm", ""),
    ("linalg.norm", "subgradients_at_zero"), ("linalg.cond", ""), ("norm", "nuc"),
    ("norm", "fro"), ("norm", "inf"),
    # more of what the 2026-12-05 --all sweep found training IR keeping (import/ops/export_ir.rs)
    ("cross", ""), ("isin", ""), ("linspace", "tensor_overload"), ("logspace", "tensor_overload"),
    ("as_strided_scatter", ""), ("nn.functional.pad", "circular"), ("torch.ops.aten._safe_softmax.default", ""),
    ("round", "decimals_3"), ("round", "decimals_neg_3"), ("sgn", ""), ("unsafe_split", ""), ("__rpow__", ""),
    ("hsplit", ""), ("vsplit", ""), ("dsplit", ""), ("angle", ""), ("isposinf", ""), ("isneginf", ""),
    ("isreal", ""), ("atleast_1d", ""), ("atleast_2d", ""), ("atleast_3d", ""), ("_unsafe_masked_index", ""),
    ("_unsafe_masked_index_put_accumulate", ""), ("put", ""), ("take", ""), ("new_empty_strided", ""),
    ("_chunk_cat", ""), ("msort", ""), ("movedim", ""), ("resize_", ""), ("resize_as_", ""), ("zero_", ""),
    ("H", ""), ("mH", ""), ("nn.functional.feature_alpha_dropout", "without_train"), ("nanmean", ""),
    ("argsort", ""), ("diagflat", ""), ("fft.fftshift", ""), ("fft.ifftshift", ""), ("linalg.diagonal", ""),
    ("linalg.vecdot", ""), ("linalg.multi_dot", ""), ("special.xlog1py", ""), ("masked.var", ""),
    ("masked.std", ""), ("masked.normalize", ""), ("native_layer_norm", ""), ("native_group_norm", ""),
    ("native_dropout_backward", ""), ("_softmax_backward_data", ""), ("linalg.matrix_power", ""),
    ("triangular_solve", ""), ("cholesky_inverse", ""), ("linalg.tensorinv", ""), ("linalg.tensorsolve", ""),
    ("linalg.lu", ""), ("lu_unpack", ""), ("linalg.lu_solve", ""), ("lu_solve", ""), ("lu", ""), ("geqrf", ""),
    ("linalg.householder_product", ""), ("ormqr", ""),
    ("nn.functional.max_unpool1d", ""), ("nn.functional.max_unpool2d", ""), ("nn.functional.max_unpool3d", ""),
    ("nn.functional.adaptive_max_pool1d", ""), ("nn.functional.adaptive_max_pool2d", ""),
    ("nn.functional.adaptive_max_pool3d", ""), ("nn.functional.bilinear", ""), ("fft.hfft", ""), ("fft.hfft2", ""),
    ("fft.hfftn", ""), ("fft.fft", ""), ("fft.ifft", ""), ("fft.fft2", ""), ("fft.ifft2", ""), ("fft.fftn", ""),
    ("fft.ifftn", ""), ("fft.rfft", ""), ("fft.irfft", ""), ("real", ""), ("imag", ""), ("conj", ""),
    ("conj_physical", ""), ("resolve_conj", ""), ("view_as_real", ""), ("stft", ""), ("istft", ""), ("randint_like", ""), ("fft.ihfft", ""), ("fft.ihfft2", ""), ("fft.ihfftn", ""), ("polar", ""), ("mvlgamma", "mvlgamma_p_1"), ("mvlgamma", "mvlgamma_p_3"), ("mvlgamma", "mvlgamma_p_5"),
    ("trapz", ""), ("trapezoid", ""), ("cumulative_trapezoid", ""), ("linalg.vander", ""), ("renorm", ""),
    ("nn.functional.cosine_embedding_loss", ""), ("nn.functional.margin_ranking_loss", ""),
    ("nn.functional.soft_margin_loss", ""), ("nn.functional.hinge_embedding_loss", ""),
    ("nn.functional.poisson_nll_loss", ""), ("nn.functional.triplet_margin_loss", ""), ("gradient", ""),
    # special functions
    ("lgamma", ""), ("digamma", ""), ("i0", ""), ("special.i0e", ""), ("special.i1", ""), ("special.i1e", ""),
    ("special.erfcx", ""), ("special.ndtr", ""), ("special.log_ndtr", ""), ("special.bessel_j0", ""),
    ("special.bessel_j1", ""), ("special.bessel_y0", ""), ("special.bessel_y1", ""), ("special.entr", ""),
    ("repeat_interleave", ""), ("isclose", ""), ("nn.functional.instance_norm", ""), ("max", "binary"),
    ("min", "binary"), ("logaddexp2", ""), ("xlogy", ""), ("lerp", ""), ("addcmul", ""), ("addcdiv", ""),
    ("nn.functional.celu", ""), ("nn.functional.softsign", ""), ("nn.functional.tanhshrink", ""),
    ("nn.functional.hardshrink", ""), ("nn.functional.softshrink", ""), ("nn.functional.threshold", ""),
    ("dist", ""), ("linalg.cross", ""), ("outer", ""), ("inner", ""), ("dot", ""), ("mv", ""), ("addmv", ""),
    ("baddbmm", ""), ("kron", ""), ("diag", ""), ("diag_embed", ""), ("frac", ""), ("deg2rad", ""),
    ("rad2deg", ""), ("sinc", ""), ("logit", ""), ("heaviside", ""), ("nn.functional.cosine_similarity", ""),
    ("nn.functional.pairwise_distance", ""), ("nn.functional.cross_entropy", ""), ("nn.functional.nll_loss", ""),
    ("nn.functional.binary_cross_entropy", ""), ("nn.functional.binary_cross_entropy_with_logits", ""),
    ("nn.functional.kl_div", ""), ("nn.functional.huber_loss", ""), ("nn.functional.softmin", ""),
    ("std_mean", ""), ("var_mean", ""), ("aminmax", ""), ("count_nonzero", ""), ("all", ""), ("nansum", ""),
    ("hstack", ""), ("vstack", ""), ("dstack", ""), ("column_stack", ""), ("fliplr", ""), ("flipud", ""),
    ("signbit", ""), ("float_power", ""), ("positive", ""), ("ravel", ""), ("block_diag", ""),
    ("nn.functional.channel_shuffle", ""), ("nn.functional.local_response_norm", ""), ("histc", ""),
    # what the --all sweep found missing (issue 10): torch.special's orthogonal polynomials, zeta/polygamma, Bessel
    ("special.chebyshev_polynomial_t", ""), ("special.chebyshev_polynomial_u", ""), ("special.chebyshev_polynomial_v", ""),
    ("special.chebyshev_polynomial_w", ""), ("special.shifted_chebyshev_polynomial_t", ""),
    ("special.shifted_chebyshev_polynomial_u", ""), ("special.shifted_chebyshev_polynomial_v", ""),
    ("special.shifted_chebyshev_polynomial_w", ""), ("special.hermite_polynomial_h", ""),
    ("special.hermite_polynomial_he", ""), ("special.laguerre_polynomial_l", ""), ("special.legendre_polynomial_p", ""),
    ("special.zeta", ""), ("polygamma", "polygamma_n_0"), ("polygamma", "polygamma_n_1"), ("polygamma", "polygamma_n_2"),
    ("polygamma", "polygamma_n_3"), ("polygamma", "polygamma_n_4"), ("special.polygamma", "special_polygamma_n_0"),
    ("special.spherical_bessel_j0", ""), ("special.modified_bessel_i0", ""), ("special.modified_bessel_i1", ""),
    ("igamma", ""), ("igammac", ""),
    # the sweep's next refusals (issue 10): training IR's copies of views, grids and combinatorics, products
    # with a bias; then selection along a dim, gcd/lcm, frexp/ldexp, matrix_exp
    ("alias_copy", ""), ("as_strided_copy", ""), ("diagonal_copy", ""), ("expand_copy", ""), ("narrow_copy", ""),
    ("permute_copy", ""), ("split_with_sizes_copy", ""), ("squeeze_copy", ""), ("t_copy", ""), ("transpose_copy", ""),
    ("unbind_copy", ""), ("unfold_copy", ""), ("unsqueeze_copy", ""), ("view_copy", ""),
    ("meshgrid", "variadic_tensors"), ("meshgrid", "list_of_tensors"), ("cartesian_prod", ""), ("combinations", ""),
    ("addr", ""), ("addbmm", ""), ("sum_to_size", ""), ("unsafe_chunk", ""),
    ("kthvalue", ""), ("median", ""), ("nanmedian", ""), ("mode", ""),
    ("gcd", ""), ("lcm", ""), ("frexp", ""), ("ldexp", ""),
    ("matrix_exp", ""),
    # the top refusals after that (issue 10): erfinv, index_reduce, unique, bincount
    ("erfinv", ""), ("index_reduce", "prod"), ("index_reduce", "mean"), ("index_reduce", "amax"),
    ("index_reduce", "amin"), ("unique", ""), ("unique_consecutive", ""), ("bincount", ""),
    ("searchsorted", ""), ("bucketize", ""), ("quantile", ""), ("nanquantile", ""),
    ("special.modified_bessel_k0", ""), ("special.modified_bessel_k1", ""),
    ("special.scaled_modified_bessel_k0", ""), ("special.scaled_modified_bessel_k1", ""), ("special.ndtri", ""),
    ("special.airy_ai", ""), ("_segment_reduce", "lengths"), ("_segment_reduce", "offsets"),
    ("vdot", ""),
    # the "Refused" table's next (issue 10): nextafter, the multi-class margin losses
    ("nextafter", ""), ("nn.functional.multi_margin_loss", ""), ("nn.functional.multilabel_margin_loss", ""),
    ("grid_sampler_3d", ""), ("histogram", ""), ("histogramdd", ""),
    # torch_nn's chunked linear cross-entropy (a library custom op torch.export keeps)
    ("nn.functional.linear_cross_entropy", "chunked"), ("nn.functional.linear_cross_entropy", "chunked_none"),
    # LAPACK's sytrf/sytrs (Bunch-Kaufman LDL^T)
    ("linalg.ldl_factor", ""), ("linalg.ldl_factor_ex", ""), ("linalg.ldl_solve", ""),
]
# Ops whose committed cases are fewer than COMMITTED's (simple redirections:
# a sample or two is enough to show the conversion).
FEW = {name: {"f32": 1, "i64": 1} for name in (
    "alias_copy", "as_strided_copy", "diagonal_copy", "expand_copy", "narrow_copy", "permute_copy",
    "split_with_sizes_copy", "squeeze_copy", "t_copy", "transpose_copy", "unbind_copy", "unfold_copy",
    "unsqueeze_copy", "view_copy", "unsafe_chunk", "meshgrid.list_of_tensors")}

DTYPES = {
    "f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8,
    "bool": torch.bool,
    # Complex64 at a program's boundary and inside it (kiln lowers complex
    # values onto (real, imaginary) pairs op by op).
    "c64": torch.complex64,
    # Complex128: only the committed linear-algebra cases below (EXTRA) and
    # explicit --per-dtype runs; --full and --all leave it out.
    "c128": torch.complex128,
}
# The committed subset: samples per dtype for every op ...
COMMITTED = {"f32": 2, "bf16": 1, "i64": 1, "bool": 1}
# ... plus, for the ops below only, one sample (`<dtype>_0`, aten flavour) in
# each extra dtype: the paths where a dtype changes what kiln does. Other
# dtypes are --full only. An op listed for a dtype torch's CPU lacks gets no
# case (F.avg_pool3d, cdist and F.pdist have no f16, F.interpolate.nearest no
# i8). bmm is left out: its only sample is over MAX_NUMEL in every dtype.
EXTRA_GROUPS = [
    # f64 and f16: composites, legalized kernels (f16 computed in f32, f64 kept
    # native), reductions/accumulations, a few transcendental and rounding ops.
    (("f64", "f16"), [
        "F.conv1d", "F.conv2d", "F.conv_transpose1d", "F.conv_transpose2d", "F.linear", "mm", "matmul",
        "addmm", "einsum", "F.layer_norm", "F.group_norm", "F.rms_norm", "F.batch_norm", "_native_batch_norm_legit",
        "softmax", "log_softmax", "F.scaled_dot_product_attention", "F.max_pool2d", "F.avg_pool2d",
        "F.adaptive_avg_pool2d", "F.max_pool3d", "F.avg_pool3d", "F.adaptive_avg_pool3d", "F.interpolate.bilinear",
        "F.interpolate.nearest", "F.grid_sample", "F.embedding_bag", "cdist", "F.pdist", "var", "std", "cumsum",
        "sort", "topk", "sum", "mean", "prod", "scatter_reduce.mean", "exp", "log", "tanh", "sigmoid", "F.gelu",
        "F.softplus", "F.mish", "pow", "div.no_rounding_mode", "atan2", "fmod", "remainder", "round",
        "frexp", "ldexp",
        "matrix_exp", "erfinv", "index_reduce.mean", "index_reduce.prod", "unique",
    ]),
    # f64 for the SVD/eigenvector family (torch's CPU linalg takes f32 and f64 only).
    (("f64",), [
        "linalg.eigh", "linalg.svd", "svd", "linalg.svdvals", "linalg.pinv", "linalg.pinv.singular",
        "linalg.pinv.hermitian", "pinverse", "linalg.matrix_rank", "linalg.matrix_rank.hermitian",
        "linalg.matrix_norm", "linalg.norm", "linalg.cond", "norm.nuc", "linalg.matrix_power", "triangular_solve",
        "cholesky_inverse", "linalg.tensorinv", "linalg.tensorsolve", "linalg.lu", "lu_unpack", "linalg.lu_solve",
        "lu_solve", "lu", "geqrf", "linalg.householder_product", "ormqr",
    ]),
    # i8 and u8: integer legalization wraps like torch (narrow overflow),
    # promotion of narrow ints (sum/prod/cumsum accumulate in i64, true
    # division gives float), unsigned semantics (neg/abs/sign/compares/sort on u8).
    (("i8", "u8"), [
        "add", "sub", "mul", "rsub", "square", "pow", "abs", "neg", "sign", "bitwise_not", "div.no_rounding_mode",
        "div.trunc_rounding", "div.floor_rounding", "remainder", "fmod", "floor_divide", "clamp", "maximum", "eq",
        "lt", "where", "sum", "prod", "cumsum", "mean", "amax", "any", "argmax", "sort", "mm",
        "scatter_add", "index_put", "F.interpolate.nearest", "gcd", "lcm", "index_reduce.mean", "bincount",
        "unique",
    ]),
    # complex64: the complex ops kiln lowers onto (real, imaginary) pairs,
    # with complex inputs and outputs at the program's boundary.
    (("c64",), [
        "add", "sub", "mul", "div.no_rounding_mode", "true_divide", "square", "abs", "angle", "neg", "matmul",
        "mm", "sum", "mean", "flip", "reshape", "view", "transpose", "permute", "cat", "stack", "fft.hfft",
        "fft.fft", "fft.ifft", "fft.fft2", "fft.ifft2", "fft.fftn", "fft.ifftn", "fft.irfft", "real", "imag",
        "conj", "conj_physical", "resolve_conj", "view_as_real", "exp",
        # complex math in f64 (compiler/src/import/ops/complex_math.rs)
        "sqrt", "rsqrt", "reciprocal", "log", "log1p", "expm1", "sin", "tan", "cosh", "tanh", "asin", "acosh",
        "atan", "sigmoid", "sgn", "sinc", "isnan", "eq", "where", "pow", "prod", "cumprod",
        # the real ops on the parts (complex_ops.rs) and the embedding (complex_linalg.rs)
        "addmm", "baddbmm", "mv", "dot", "vdot", "outer", "kron", "F.conv1d", "addcmul", "cumsum", "tril", "roll",
        "diag_embed", "index_put", "scatter", "masked_fill", "trapz", "var", "std", "linalg.vector_norm", "any",
        "nonzero", "linalg.inv", "linalg.solve", "linalg.pinv", "linalg.svdvals", "linalg.eigvalsh",
        "linalg.matrix_rank",
        # composites (complex_composite.rs, complex_ops.rs), private in-place writes
        "logsumexp", "logaddexp", "logcumsumexp", "isclose", "ldexp", "F.rms_norm", "linalg.vander",
        "F.pairwise_distance", "F.triplet_margin_loss", "renorm", "F.normalize", "softmax.with_dtype",
        "log_softmax.with_dtype", "linspace.tensor_overload", "logspace.tensor_overload", "_chunk_cat",
        "linalg.multi_dot", "linalg.tensorinv", "linalg.tensorsolve", "matrix_exp", "linalg.pinv.hermitian",
        "resize_as_", "zero_", "stft", "istft",
        # complex factorizations on the linalg kernel's complex path (complex_factor.rs)
        "linalg.det", "linalg.slogdet", "logdet", "linalg.lu_factor", "linalg.lu_factor_ex", "lu", "linalg.lu",
        "lu_unpack", "lu_solve", "linalg.lu_solve", "linalg.cholesky", "linalg.cholesky_ex", "cholesky_solve",
        "cholesky_inverse", "linalg.solve_triangular", "triangular_solve", "linalg.qr", "geqrf",
        "linalg.householder_product", "ormqr", "linalg.ldl_factor", "linalg.ldl_factor_ex", "linalg.ldl_solve",
        "linalg.eigh", "linalg.svd", "svd",
    ]),
    # complex128: the complex linear algebra kernel on f64 parts.
    (("c128",), [
        "linalg.det", "linalg.slogdet", "linalg.lu_solve", "linalg.cholesky", "cholesky_solve", "linalg.qr",
        "linalg.householder_product", "linalg.ldl_solve", "linalg.eigh", "linalg.svd", "linalg.solve_triangular",
    ]),
    # i32 and i16: the wide-integer paths of the same wrapping/promotion logic.
    (("i32", "i16"), [
        "add", "mul", "div.floor_rounding", "remainder", "bitwise_not", "sum", "prod", "cumsum", "mm", "gcd", "lcm",
        "bincount",
    ]),
]
# Extra dtypes whose committed cases take two samples: the complex
# determinants' first OpInfo sample is a 0 x 0 matrix.
EXTRA_TWO = {name: {"c64"} for name in ("linalg.det", "linalg.slogdet", "logdet")}
EXTRA = {}  # case op name -> extra dtypes (committed subset only)
for _dtypes, _ops in EXTRA_GROUPS:
    for _op in _ops:
        EXTRA.setdefault(_op, set()).update(_dtypes)
FULL = {d: 4 for d in DTYPES if d != "c128"}
SWEEP = {d: 1 for d in DTYPES if d != "c128"}  # --all: the first exportable sample of each dtype
MAX_NUMEL = 512
# Sample indices tried first (then the rest), so that a few samples cover an
# op's modes: grid_sample reflection/bilinear and border/nearest, cdist's
# matrix-product p=2 and broadcast p=1, pdist p=2 and p=10, embedding_bag with
# padding_idx=-1 and with max_norm (renorm), 0-d topk/softmax/log_softmax and
# gather with an empty index of another rank, conv2d padding='same' needing
# asymmetric padding, negative reflect/replicate padding; unique/unique_consecutive with inverse
# and counts on data with repeats, searchsorted with a sorter (n-d and 1-d sequences), bucketize
# right=True on ints (ties), (nan)quantile with a q tensor and keepdim, midpoint on 4-d, no dim,
# segment_reduce mean with empty segments, prod on 2-d data.
PICK = {"F.grid_sample": [4, 3, 9, 0, 12], "F.embedding_bag": [5, 8], "topk": [0, 7], "softmax": [0, 6],
        "log_softmax": [0, 6], "gather": [0, 4], "F.conv2d": [0, 11], "F.pad.reflect": [0, 11], "F.pad.replicate": [0, 11], "cdist": [16, 13, 80, 144], "F.pdist": [3, 6, 7, 4],
        "unique": [202, 142, 0], "unique_consecutive": [94, 40, 0], "searchsorted": [166, 43, 76, 163],
        "bucketize": [9, 14, 4], "quantile": [47, 57, 21], "nanquantile": [47, 57, 21],
        "_segment_reduce.lengths": [22, 38, 26], "_segment_reduce.offsets": [22, 38, 26]}

# (case op name, sample ("f32_0"), dtype or "*", flavour or "*") -> why kiln rejects it. Kept here
# so that regenerating keeps the marks (`--remark` rewrites only the marks);
# the conformance test fails on any other failure.
KNOWN_UNSUPPORTED = {
    ("bincount", "i64", "*"): "data-dependent length with no upper bound (OpInfo's program has no torch._check on it): kiln plans memory for the largest length (bincount.extra bounds it)",
    ("bincount", "i32", "*"): "data-dependent length with no upper bound (OpInfo's program has no torch._check on it): kiln plans memory for the largest length (bincount.extra bounds it)",
    ("F.batch_norm", "*_0", "aten"): "writes into its inputs (training-mode batch norm updates running_mean/running_var in place): kiln refuses a program that mutates a user input",
    ("_native_batch_norm_legit", "*_0", "aten"): "writes into its inputs (training-mode batch norm updates running_mean/running_var in place): kiln refuses a program that mutates a user input",
    ("_native_batch_norm_legit", "f32_1", "aten"): "writes into its inputs (training-mode batch norm updates running_mean/running_var in place): kiln refuses a program that mutates a user input",
    ("aten._native_batch_norm_legit.default", "*_0", "aten"): "writes into its inputs (training-mode batch norm updates running_mean/running_var in place): kiln refuses a program that mutates a user input",
    ("aten._native_batch_norm_legit.default", "f32_1", "aten"): "writes into its inputs (training-mode batch norm updates running_mean/running_var in place): kiln refuses a program that mutates a user input",
    ("F.instance_norm", "*", "*"): "writes into its inputs (use_input_stats with running statistics updates them in place): kiln refuses a program that mutates a user input",
    ("grouped_mm_fallback.extra", "i64", "*"): "integer grouped GEMM: kiln's grouped_mm_fallback takes f32, f64, f16 and bf16 (a compile-time error naming the op)",
    ("F.embedding_bag", "f32_1", "*"): "writes into its input (max_norm renormalises the weight in place): kiln refuses a program that mutates a user input",
    ("matrix_exp", "f32", "*"): "f64 only: torch's f32 scaling and squaring misses the exact exponential by more than its own tolerance on large norms (2e-3 relative on this sample set), and kiln does not reproduce its rounding",
    ("matrix_exp", "bf16", "*"): "f64 only: torch's bf16 scaling and squaring overflows to NaN on OpInfo's sample, which kiln does not reproduce",
    ("matrix_exp", "f16", "*"): "f64 only: torch's f16 scaling and squaring rounds in the dtype, which kiln does not reproduce",
    ("matrix_exp", "c64", "*"): "complex128 only: torch's complex64 scaling and squaring misses the exact exponential (which kiln computes) by more than its own tolerance on large norms, as for f32",
}


def tie_order(cname, sample):
    """For topk: which indices torch returns among equal values is left to
    the C++ library's unstable partial sort/nth_element (libstdc++ and libc++
    builds of torch differ), so the case records where the indices may
    differ: the test then checks that kiln's indices select torch's values
    from the input along `dim` (and are distinct), instead of comparing them.
    kthvalue/median/nanmedian pick by quickselect, whose order among ties no
    rule gives: their indices (when the overload has them) are checked the
    same way."""
    args = list(sample.args)
    if cname in ("topk", "kthvalue"):
        dim = args[1] if len(args) > 1 else sample.kwargs.get("dim", -1)
    elif cname in ("median", "nanmedian"):
        dim = args[0] if args else sample.kwargs.get("dim")
        if dim is None:  # the whole-tensor overload: no indices
            return None
    else:
        return None
    rank = max(sample.input.dim(), 1)
    return {"input": 0, "values": 0, "indices": 1, "dim": dim % rank}


# Ops whose outputs torch leaves uninitialised: their values are whatever the
# allocator returned, so the test checks only dtypes and shapes.
UNINITIALIZED = {"new_empty", "new_empty_strided", "empty_like", "empty_strided"}


def sign_groups(cname, outputs):
    """For eigenvectors and singular vectors, which LAPACK returns with
    signs its algorithm happens to give (kiln picks its own): groups of
    outputs whose vectors flip together, as {output, dim} with `dim` the
    axis that indexes the vectors (-1: columns, -2: rows). The test flips
    kiln's vectors to torch's signs before comparing (tests/src/signs.rs)."""
    if cname == "linalg.eigh" and len(outputs) == 2:
        return [[{"output": 1, "dim": -1}]]
    if cname in ("linalg.svd", "svd") and len(outputs) == 3:
        v_dim = -1 if cname == "svd" else -2  # torch.svd returns V, linalg.svd Vh
        return [[{"output": 0, "dim": -1}, {"output": 2, "dim": v_dim}]]
    return None


def marks(op, dtype, sample, flavours):
    """{flavour: reason} for the flavours KNOWN_UNSUPPORTED marks (a key's
    second entry is a sample name like `f32_0`, `*_0` for the first sample of
    every dtype, a dtype, or `*`)."""
    out = {}
    for f in flavours:
        nth = "*_" + sample.rsplit("_", 1)[-1]  # the n-th sample of any dtype
        for key in ((op, sample, f), (op, sample, "*"), (op, nth, f), (op, nth, "*"), (op, dtype, f), (op, "*", f), (op, dtype, "*"), (op, "*", "*")):
            if key in KNOWN_UNSUPPORTED:
                out[f] = KNOWN_UNSUPPORTED[key]
                break
    return out


def case_name(name, variant):
    base = name.replace("nn.functional.", "F.")
    return f"{base}.{variant}" if variant else base


def to_numpy(t):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy() if hasattr(torch, "uint16") else t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


class OpModule(torch.nn.Module):
    """Calls `fn` on the sample's arguments, with its tensors as forward inputs."""

    def __init__(self, fn, spec, leaves, tensor_slots):
        super().__init__()
        self.fn, self.spec, self.leaves, self.tensor_slots = fn, spec, leaves, tensor_slots

    def forward(self, *tensors):
        leaves = list(self.leaves)
        for slot, t in zip(self.tensor_slots, tensors):
            leaves[slot] = t
        inp, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.fn(inp, *args, **kwargs)


def graph_targets(ep):
    return sorted({str(n.target) for n in ep.graph.nodes if n.op == "call_function"})


def close(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    try:
        torch.testing.assert_close(a, b, equal_nan=True)
        return True
    except AssertionError:
        return False


def build_case(op, sample):
    """-> (module, inputs, outputs) or raises ValueError(why)."""
    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    slots = [i for i, l in enumerate(leaves) if isinstance(l, torch.Tensor)]
    inputs = [leaves[i].detach().clone().contiguous() for i in slots]
    if not inputs:
        raise ValueError("no tensor inputs")
    if sum(t.numel() for t in inputs) > MAX_NUMEL:
        raise ValueError("too large")
    if any(t.dtype not in DTYPES.values() for t in inputs):
        raise ValueError("input dtype outside kiln's set")
    mod = OpModule(op.op, spec, leaves, slots).eval()
    with torch.no_grad():
        out = mod(*inputs)
    outs, _ = pytree.tree_flatten(out)
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        raise ValueError(f"non-tensor output {type(out).__name__}")
    if any(o.dtype not in DTYPES.values() for o in outs):
        raise ValueError("output dtype outside kiln's set")
    return mod, inputs, [o.detach().clone().contiguous() for o in outs]


def export_case(mod, inputs, outputs):
    """-> (training ep, aten ep) or raises ValueError(why)."""
    try:
        ep = torch.export.export(mod, tuple(inputs))
    except Exception as e:  # noqa: BLE001 - any export failure is a skip reason
        raise ValueError(f"export failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
    try:
        aten = ep.run_decompositions()
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"run_decompositions failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    for flavour, prog in (("training", ep), ("aten", aten)):
        with torch.no_grad():
            got, _ = pytree.tree_flatten(prog.module()(*inputs))
        if len(got) != len(outputs) or not all(close(g, w) for g, w in zip(got, outputs)):
            raise ValueError(f"torch's own {flavour} program disagrees with eager")
    return ep, aten


def kept_entries(path, only, key, lists, dtypes=()):
    """A manifest holding, for each of `lists`, the entries of the existing
    manifest at `path` whose `key` is not being regenerated (`only`; with
    `dtypes`, only those dtypes of it are); empty lists when everything is
    regenerated or there is no manifest yet."""
    manifest = {name: [] for name in lists}
    if only and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        for name in lists:
            manifest[name] = [e for e in old.get(name, [])
                              if e[key] not in only or (dtypes and e.get("dtype") not in dtypes)]
    return manifest


def write_manifest(path, manifest):
    """manifest.json as the generators write it (indent 1, final newline)."""
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


def strip_sample_inputs(path):
    """Drops the pickled example inputs (kiln ignores them) to keep cases small."""
    tmp = path + ".tmp"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            if "/data/sample_inputs/" in info.filename:
                continue
            dst.writestr(info, src.read(info.filename))
    os.replace(tmp, path)


def save_case(out, cname, dname, made, ep, aten, inputs, outputs, with_training):
    """Writes one case's programs and tensors under out/<cname>/<dname>_<made>
    and returns its manifest entry. The training-IR program is kept only
    where it differs from Core ATen, and only when `with_training`."""
    rel = f"{cname}/{dname}_{made}"
    d = os.path.join(out, rel)
    os.makedirs(d, exist_ok=True)
    flavours = ["aten"]
    torch.export.save(aten, os.path.join(d, "aten.pt2"))
    strip_sample_inputs(os.path.join(d, "aten.pt2"))
    if graph_targets(ep) != graph_targets(aten) and with_training:
        torch.export.save(ep, os.path.join(d, "training.pt2"))
        strip_sample_inputs(os.path.join(d, "training.pt2"))
        flavours.insert(0, "training")
    for i, t in enumerate(inputs):
        np.save(os.path.join(d, f"input_{i}.npy"), to_numpy(t))
    for i, t in enumerate(outputs):
        np.save(os.path.join(d, f"output_{i}.npy"), to_numpy(t))
    return {
        "op": cname,
        "dtype": dname,
        "dir": rel,
        "flavours": flavours,
        "inputs": [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in inputs],
        "outputs": [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in outputs],
        "aten_ops": graph_targets(aten),
        "training_ops": graph_targets(ep),
    }


# Core ATen overloads no OpInfo sample reaches in an exported graph: `x - 2`
# exports as sub.Tensor, never sub.Scalar, and torch's own
# run_decompositions() rewrites some core overloads further (reflection_pad*,
# col2im, select_scatter, squeeze.dim, var.dim, fill.Scalar, atan2.out), so
# only the training-IR program keeps them. Each case calls the overload
# directly on seeded inputs, in every dtype torch's CPU kernel accepts
# (one sample each, two for f32), and keeps the training-IR program for every
# dtype. Case names are `aten.<overload>`.
A = torch.ops.aten


def rnd(shape, dtype, low=-9, high=10):
    """Seeded values for `dtype`: normals x3 for floats, [low, high) for ints
    ([0, high) for uint8), fair coins for bool."""
    if dtype.is_floating_point:
        return (torch.randn(shape) * 3).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape).bool()
    return torch.randint(max(low, 0) if dtype == torch.uint8 else low, high, shape).to(dtype)


def scalar_for(dtype, f, i):
    """A Python scalar argument of the kind torch expects for `dtype`."""
    return f if dtype.is_floating_point else (bool(i) if dtype == torch.bool else i)


def batch_norm_legit(x, w, b, rm, rv):
    return A._native_batch_norm_legit.default(x, w, b, rm, rv, True, 0.1, 1e-5)


# name -> (fn(*tensors), inputs(dtype, sample_index) -> [tensors], dtypes or None for all)
FLOATS = ("f32", "f64", "f16", "bf16")
INTS = ("i64", "i32", "i16", "i8", "u8")
DIRECT = {
    "any.dims": (lambda x: A.any.dims(x, [0, 2]), lambda d, k: [rnd((3, 4, 2 + k), d) * (torch.rand(3, 4, 2 + k) > 0.7).to(d)], None),
    "atan2.out": (lambda a, b: A.atan2.out(a, b, out=torch.empty_like(a)), lambda d, k: [rnd((3, 4 + k), d), rnd((3, 4 + k), d)], FLOATS),
    "bitwise_and.Scalar": (lambda a: A.bitwise_and.Scalar(a, scalar_for(a.dtype, 0, 5)), lambda d, k: [rnd((2, 3 + k), d)], INTS + ("bool",)),
    "bitwise_and.Tensor": (lambda a, b: A.bitwise_and.Tensor(a, b), lambda d, k: [rnd((2, 3 + k), d), rnd((3 + k,), d)], INTS + ("bool",)),
    "bitwise_or.Scalar": (lambda a: A.bitwise_or.Scalar(a, scalar_for(a.dtype, 0, 6)), lambda d, k: [rnd((2, 3 + k), d)], INTS + ("bool",)),
    "bitwise_or.Tensor": (lambda a, b: A.bitwise_or.Tensor(a, b), lambda d, k: [rnd((2, 3 + k), d), rnd((2, 3 + k), d)], INTS + ("bool",)),
    "bitwise_xor.Scalar": (lambda a: A.bitwise_xor.Scalar(a, scalar_for(a.dtype, 0, 3)), lambda d, k: [rnd((2, 3 + k), d)], INTS + ("bool",)),
    "bitwise_xor.Tensor": (lambda a, b: A.bitwise_xor.Tensor(a, b), lambda d, k: [rnd((2, 3 + k), d), rnd((2, 1), d)], INTS + ("bool",)),
    # [N, C*kh*kw, L] -> [N, C, H, W]: a 2x2 kernel over 4x5 (stride 1), and a padded, strided, dilated one.
    "col2im.default": (
        lambda c: A.col2im.default(c, [4, 5], [2, 2], [1, 1], [0, 0], [1, 1]) if c.shape[1] == 12
        else A.col2im.default(c, [5, 6], [2, 3], [2, 1], [1, 2], [2, 2]),
        lambda d, k: [rnd((1, 12, 12), d)] if k == 0 else [rnd((2, 6, 12), d)], FLOATS),
    "copy.default": (lambda a, b: A.copy.default(a, b), lambda d, k: [rnd((3, 4), d), rnd((4,) if k else (3, 4), d)], None),
    "div.Scalar": (lambda a: A.div.Scalar(a, 3), lambda d, k: [rnd((3, 4 + k), d)], FLOATS + INTS),
    "div.Scalar_mode": (lambda a: A.div.Scalar_mode(a, scalar_for(a.dtype, -2.5, 3), rounding_mode="floor" if a.shape[-1] % 2 else "trunc"),
                        lambda d, k: [rnd((3, 4 + k), d)], FLOATS + INTS),
    "empty.memory_format": (lambda a: torch.empty(a.shape, dtype=a.dtype).fill_(scalar_for(a.dtype, 2.5, 2)) + a, lambda d, k: [rnd((2, 3 + k), d)], FLOATS + INTS),
    "empty_strided.default": (lambda a: torch.empty_strided(a.shape, (1, a.shape[0]), dtype=a.dtype).fill_(scalar_for(a.dtype, 1.5, 1)) * a,
                              lambda d, k: [rnd((2, 3 + k), d)], FLOATS + INTS),
    "fill.Scalar": (lambda a: A.fill.Scalar(a, scalar_for(a.dtype, -1.25, 7)), lambda d, k: [rnd((2, 3 + k), d)], None),
    "fmod.Scalar": (lambda a: A.fmod.Scalar(a, scalar_for(a.dtype, 1.5, 4)), lambda d, k: [rnd((3, 4 + k), d)], FLOATS + INTS),
    "lt.Scalar": (lambda a: A.lt.Scalar(a, scalar_for(a.dtype, 0.5, 1)), lambda d, k: [rnd((3, 4 + k), d)], FLOATS + INTS),
    "ne.Scalar": (lambda a: A.ne.Scalar(a, scalar_for(a.dtype, 0.0, 0)), lambda d, k: [rnd((3, 4 + k), d) * (torch.rand(3, 4 + k) > 0.5).to(d)], None),
    "pow.Scalar": (lambda a: A.pow.Scalar(scalar_for(a.dtype, 1.5, 2), a), lambda d, k: [rnd((3, 4 + k), d, 0, 7)], FLOATS + INTS),
    "remainder.Scalar": (lambda a: A.remainder.Scalar(a, scalar_for(a.dtype, -1.5, 4)), lambda d, k: [rnd((3, 4 + k), d)], FLOATS + INTS),
    "sub.Scalar": (lambda a: A.sub.Scalar(a, scalar_for(a.dtype, 2.5, 3)), lambda d, k: [rnd((3, 4 + k), d)], FLOATS + INTS),
    "reflection_pad1d.default": (lambda a: A.reflection_pad1d.default(a, [2, 1 + a.dim() % 2]), lambda d, k: [rnd((3, 5) if k else (2, 3, 5), d)], None),
    "reflection_pad2d.default": (lambda a: A.reflection_pad2d.default(a, [1, 2, 2, 0]), lambda d, k: [rnd((3, 4, 5) if k else (2, 3, 4, 5), d)], None),
    "reflection_pad3d.default": (lambda a: A.reflection_pad3d.default(a, [1, 2, 0, 1, 1, 1]), lambda d, k: [rnd((1, 2, 3, 4, 5), d)], None),
    "replication_pad2d.default": (lambda a: A.replication_pad2d.default(a, [1, 2, 3, 0]), lambda d, k: [rnd((3, 4, 5) if k else (2, 3, 4, 5), d)], None),
    "replication_pad3d.default": (lambda a: A.replication_pad3d.default(a, [2, 1, 0, 1, 1, 2]), lambda d, k: [rnd((1, 2, 3, 4, 5), d)], None),
    "repeat.default": (lambda a: A.repeat.default(a, [2, 1, 3]), lambda d, k: [rnd((3, 4 - k), d)], None),
    "scatter.value": (lambda a, i: A.scatter.value(a, 1, i, scalar_for(a.dtype, 2.5, 5)),
                      lambda d, k: [rnd((3, 4), d), torch.tensor([[0, 3], [2, 2], [1, 0]])[:, : 1 + k]], None),
    "select_scatter.default": (lambda a, b: A.select_scatter.default(a, b, 1, -2), lambda d, k: [rnd((3, 4, 2), d), rnd((3, 2), d)], None),
    "slice_scatter.default": (lambda a, b: A.slice_scatter.default(a, b, 1, 1, 6, 2) if k_of(b) else A.slice_scatter.default(a, b, 0, -2),
                              lambda d, k: [rnd((3, 6), d), rnd((3, 3), d)] if k else [rnd((3, 6), d), rnd((2, 6), d)], None),
    "squeeze.dim": (lambda a: A.squeeze.dim(a, -2), lambda d, k: [rnd((3, 1, 4 + k), d)], None),
    "var.dim": (lambda a: A.var.dim(a, [1], a.shape[0] == 3), lambda d, k: [rnd((3 + k, 5, 2), d)], ("f32", "f64", "f16", "bf16")),
    "upsample_nearest2d.vec": (lambda a: A.upsample_nearest2d.vec(a, [6, 7], None) if a.shape[-1] == 4 else A.upsample_nearest2d.vec(a, None, [2.0, 1.5]),
                               lambda d, k: [rnd((1, 2, 3, 4 + k), d)], FLOATS + ("u8",)),
    "_native_batch_norm_legit.default": (batch_norm_legit,
                                         lambda d, k: [rnd((2, 3, 4 + k), d), rnd((3,), d), rnd((3,), d), torch.zeros(3, dtype=d), torch.ones(3, dtype=d)],
                                         ("f32", "f64", "bf16")),
    "_native_batch_norm_legit.no_stats": (lambda x, w, b: A._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5),
                                          lambda d, k: [rnd((2, 3, 4 + k), d), rnd((3,), d), rnd((3,), d)], ("f32", "f64", "bf16")),
    # Integer and bool sums come out as i64 (training IR keeps sum_to_size; a bool sample sums nothing).
    "sum_to_size.default": (lambda a: A.sum_to_size.default(a, list(a.shape) if a.dtype == torch.bool else [1, a.shape[-1]]),
                            lambda d, k: [rnd((3, 4), d)], ("i64", "i8", "bool")),
    # Factories no OpInfo sample exports (they take no tensor): a triangle's indices, offset both ways.
    "tril_indices.default": (lambda a: a + A.tril_indices.default(4, 3, -1), lambda d, k: [rnd((2, 1), d)], ("f32", "i64")),
    "triu_indices.default": (lambda a: a * A.triu_indices.default(3, 5, 1), lambda d, k: [rnd((2, 1), d)], ("f32", "i64")),
    # sum (mode 0) over bags [0, 2), [2, 4), [4, 6), then mean (mode 1) with an empty bag.
    "_embedding_bag.default": (lambda w, i, o: A._embedding_bag.default(w, i, o, False, 0 if o.numel() == 3 else 1)[0],
                               lambda d, k: [rnd((10, 3), d), torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor([0, 2, 4] if k == 0 else [0, 2, 2, 5])],
                               ("f32", "f64", "bf16")),
}


# Training-IR composites whose OpInfo samples leave paths untried: each
# entry's programs run in f32 (and the first in every other listed dtype).
# Case names are `<name>.extra`.
EINSUM_EQUATIONS = [
    ("bij,bjk,bkl->bil", [(2, 3, 4), (2, 4, 5), (2, 5, 3)]),  # three operands, a batch label kept throughout
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),  # ellipsis broadcasting (1 vs 5)
    ("ii->i", [(4, 4)]),  # diagonal
    ("ij,ij,ij->i", [(3, 4), (3, 4), (3, 4)]),  # a label shared by three operands
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),  # attention scores
    ("ijk", [(2, 3, 4)]),  # implicit output (sorted, here the identity)
    ("ji,kj", [(3, 4), (2, 3)]),  # implicit output `ik`
]
# torch.fft programs (Core ATen: _fft_r2c/_fft_c2r/_fft_c2c) and the ops on
# their complex results; every case returns real tensors, as complex values
# live only inside a kiln program. Angles skip the DC/Nyquist bins, whose
# zero imaginary part may carry either sign.
FFT_CASES = [
    (lambda x: torch.fft.rfft(x).abs(), [(3, 16)]),
    (lambda x: torch.view_as_real(torch.fft.rfft(x, norm="backward")), [(2, 15)]),
    (lambda x: torch.view_as_real(torch.fft.rfft(x, norm="ortho")), [(4, 256)]),
    (lambda x: torch.view_as_real(torch.fft.rfft(x, dim=0, norm="forward")), [(7, 3)]),
    (lambda x, f: torch.fft.irfft(torch.fft.rfft(x) * f), [(3, 16), (9,)]),
    (lambda x, f: torch.fft.irfft(torch.fft.rfft(x) * f, n=15), [(3, 15), (8,)]),
    (lambda x: torch.fft.irfft(torch.fft.rfft(x), n=40, norm="ortho"), [(2, 16)]),
    (lambda x: torch.fft.irfft(torch.fft.rfft(x, n=20), n=10, norm="forward"), [(2, 16)]),
    (lambda x: torch.fft.irfft2(torch.fft.rfft2(x) * 0.5), [(2, 6, 8)]),
    (lambda x: torch.view_as_real(torch.fft.rfft2(x, norm="ortho")), [(2, 5, 6)]),
    (lambda x: torch.fft.irfftn(torch.fft.rfftn(x), s=(5, 6, 10)), [(2, 6, 8)]),
    (lambda x: torch.stft(x, 16, 4, window=torch.hann_window(16, dtype=x.dtype), return_complex=True).abs(), [(2, 100)]),
    (lambda x: torch.fft.rfft(x)[:, 1:].conj().angle(), [(3, 15)]),
    (lambda x: torch.fft.rfft(x).real + torch.fft.rfft(x).imag, [(3, 16)]),
    (lambda x: torch.view_as_real(torch.fft.rfft(x) * torch.fft.rfft(x).conj() - 1), [(3, 16)]),
    (lambda x: (torch.fft.rfft(x) / (torch.fft.rfft(x).abs() + 1)).imag + torch.fft.rfft(x).pow(2).real, [(3, 16)]),
    (lambda x: torch.view_as_real(torch.fft.fft2(x)), [(2, 4, 6)]),
    (lambda x: torch.fft.ifft(torch.fft.rfft(x)).real, [(3, 16)]),
]
def erfinv_grid(dtype):
    """401 points over [-0.99999, 0.99999] (denser in the tails; f32 to
    ±0.999: nearer ±1 erfinv's slope, ~exp(x²), turns one ulp of difference
    between erf implementations — XLA's f32 erf and libm's, under
    `--target pjrt` — into more than torch's tolerances), then ±1 (±inf), ±0,
    outside the domain (NaN) and NaN."""
    top = 0.99999 if dtype == torch.float64 else 0.999
    t = torch.linspace(-1, 1, 401, dtype=torch.float64)
    inner = torch.sign(t) * (1 - (1 - t.abs()) ** 2) * top
    edges = torch.tensor([1.0, -1.0, 0.0, -0.0, 1.5, -2.0, float("nan")], dtype=torch.float64)
    return torch.cat([inner, edges]).to(dtype)


def quantiles_with_nans(x):
    """quantile and nanquantile in the modes OpInfo leaves out (lower, higher,
    nearest), on rows with NaNs, one all-NaN row and ties."""
    q = torch.tensor([0.0, 0.25, 0.5, 0.9, 1.0], dtype=x.dtype)
    parts = [torch.quantile(x, q, dim=1, interpolation=m) for m in ("lower", "higher", "nearest", "linear")]
    parts += [torch.nanquantile(x, q, dim=1, interpolation=m) for m in ("lower", "nearest", "midpoint", "linear")]
    parts.append(torch.nanquantile(x, 0.3, dim=0, keepdim=True))
    return torch.cat([p.flatten() for p in parts])


def rows_with_nans(dtype, k):
    torch.manual_seed(k)
    x = torch.round(torch.randn(5, 7, dtype=torch.float64) * 4) / 4  # ties
    x[1, 2] = x[3, 0] = x[3, 5] = float("nan")
    x[4] = float("nan")
    return [x.to(dtype)]


def bessel_k_all(x):
    """K0, K1 and their scaled forms, side by side."""
    sp = torch.special
    fns = (sp.modified_bessel_k0, sp.modified_bessel_k1, sp.scaled_modified_bessel_k0, sp.scaled_modified_bessel_k1)
    return torch.cat([f(x) for f in fns])


def bessel_k_grid(dtype, k):
    """Both series' ranges: (0, 2] densely (the log term), around 2 (the
    switch), out to 80 (K underflows, scaled K does not), and 0 (+inf),
    negative (NaN), NaN."""
    near = torch.linspace(1e-3, 2, 120, dtype=torch.float64)
    far = torch.logspace(0.302, 1.9, 120, dtype=torch.float64)
    edges = torch.tensor([0.0, -1.0, float("nan"), 2.0, 2.0000001, 1e-30], dtype=torch.float64)
    return [torch.cat([near, far, edges]).to(dtype)]


def ndtri_grid(dtype, k):
    """ndtri over (0, 1): the central range, both tails down to 1e-300 (f64;
    f32 to its smallest normal numbers), 1 - e^-2's neighbourhood, and 0, 1,
    outside (NaN), NaN."""
    tiny = -300 if dtype == torch.float64 else -37
    tail = torch.logspace(tiny, -0.87, 120, dtype=torch.float64)
    central = torch.linspace(0.14, 0.86, 81, dtype=torch.float64)
    e2 = 0.1353352832366127
    edges = torch.tensor([0.0, 1.0, -0.5, 1.5, float("nan"), e2, 1 - e2, 0.5], dtype=torch.float64)
    return [torch.cat([tail, central, 1 - tail, edges]).to(dtype)]


def airy_grid(dtype, k):
    """Ai over its three forms and their switches (-2.09, 2.09, 8.32 where the
    series stops being computed, 103.892), and ±inf, NaN."""
    parts = [torch.linspace(-30, -2.1, 80, dtype=torch.float64), torch.linspace(-2.09, 2.09, 100, dtype=torch.float64),
             torch.linspace(2.1, 110, 80, dtype=torch.float64)]
    edges = torch.tensor([-2.09, 2.09, 8.3203353, 103.892, 0.0, float("inf"), -float("inf"), float("nan")],
                         dtype=torch.float64)
    return [torch.cat(parts + [edges]).to(dtype)]


def unique_slices(x):
    """unique and unique_consecutive of [8, 2, 3]'s slices along dim 0, with
    inverse and counts, flattened side by side (in x's dtype: small ints).
    (Along another dim torch's own Core ATen program fails to run: its
    decomposition views a non-contiguous result.)"""
    parts = [*torch.unique(x, dim=0, return_inverse=True, return_counts=True),
             *torch.unique_consecutive(x, dim=0, return_inverse=True, return_counts=True)]
    return torch.cat([t.reshape(-1).to(x.dtype) for t in parts])


def repeated_rows(dtype, k):
    """Rows of 0/1 with repeats, some consecutive, and a repeated column."""
    torch.manual_seed(k)
    base = torch.randint(0, 2, (4, 3))
    x = base[[2, 0, 0, 1, 2, 2, 3, 0]]
    return [torch.cat([x, x[:, :1], x[:, 1:]], dim=1).reshape(8, 2, 3).to(dtype)]


def segments_without_initial(x, lengths):
    """segment_reduce's five reductions without `initial` (empty segments:
    0, NaN, -inf, +inf, 1), side by side."""
    return torch.cat([torch.segment_reduce(x, r, lengths=lengths).reshape(-1)
                      for r in ("sum", "mean", "max", "min", "prod")])


def segment_data(dtype, k):
    torch.manual_seed(k)
    x = torch.randn(7, 3, dtype=torch.float64)
    x[5, 1] = float("nan")
    return [x.to(dtype), torch.tensor([2, 0, 3, 0, 2])]


def bounded_bincount(x):
    """Weighted bincount with minlength, its length bounded by torch._check."""
    counts = torch.bincount(x.abs() % 9, weights=x.float() * 0.5, minlength=4)
    torch._check(counts.size(0) <= 16)
    return counts


def igamma_both(a, x):
    """Both functions, through torch.special's names (training IR keeps them)."""
    return torch.stack([torch.special.gammainc(a, x), torch.special.gammaincc(a, x)])


def igamma_grid(dtype, k):
    """(a, x) over every regime torch's Cephes port distinguishes: x ≤ 0.5,
    0.5 < x ≤ 1.1, x > 1.1 on both sides of a, a ≈ x from 20 to 2000 (its
    asymptotic series), and the special values (0, ±inf, NaN, negatives)."""
    a = torch.tensor([0.05, 0.5, 1.0, 2.5, 7.0, 30.0, 150.0, 2000.0], dtype=torch.float64)
    ratio = torch.tensor([1e-3, 0.1, 0.6, 0.95, 1.0, 1.05, 1.3, 3.0], dtype=torch.float64)
    aa, rr = torch.meshgrid(a, ratio, indexing="ij")
    xs = torch.tensor([1e-4, 0.3, 0.5, 0.8, 1.1, 1.5, 5.0, 40.0], dtype=torch.float64)
    a2, x2 = torch.meshgrid(a, xs, indexing="ij")
    special = torch.tensor([[0.0, 2.0], [0.0, 0.0], [2.0, 0.0], [float("inf"), 3.0], [3.0, float("inf")],
                            [float("inf"), float("inf")], [-1.0, 1.0], [1.0, -1.0], [float("nan"), 1.0]],
                           dtype=torch.float64)
    a_all = torch.cat([aa.reshape(-1), a2.reshape(-1), special[:, 0]])
    x_all = torch.cat([(aa * rr).reshape(-1), x2.reshape(-1), special[:, 1]])
    return [a_all.to(dtype), x_all.to(dtype)]


def histc_cases():
    """histc beyond OpInfo's samples: an equal non-zero pair (torch then takes
    the data's range, as for 0/0), a point range (widened by one each side),
    and an explicit range with elements below, above, on both edges and NaN."""
    return [lambda x: torch.histc(x, bins=7, min=3, max=3),
            lambda x: torch.histc(x * 0 + 1.5, bins=4),
            lambda x: torch.histc(x, bins=5, min=-2, max=2)]


def histc_data(dtype, k):
    x = rnd((6, 5), dtype, -4, 5)
    if k == 2:
        x.view(-1)[:6] = torch.tensor([-2.0, 2.0, -2.5, 2.5, float("nan"), 0.8], dtype=dtype)
    return [x]


def grid_sample_3d_nearest():
    """3-d nearest sampling (OpInfo's grid_sampler_3d samples only
    trilinear) in every padding mode, with and without align_corners."""
    return [lambda x, g, p=p, a=a: torch.nn.functional.grid_sample(x, g, "nearest", p, a)
            for p in ("zeros", "border", "reflection") for a in (False, True)]


def grid_3d_data(dtype, k):
    """An input [2, 3, 3, 4, 5] and a grid reaching past [-1, 1] on every
    axis (so that padding matters), with a few exact half-pixel points."""
    x = rnd((2, 3, 3, 4, 5), dtype)
    g = (torch.rand(2, 2, 3, 4, 3) * 3.4 - 1.7).to(dtype)
    g.view(-1, 3)[:3] = torch.tensor([[0.0, 0.0, 0.0], [-1.0, 1.0, 0.5], [0.2, -0.25, 1.0]], dtype=dtype)
    return [x, g]


def nextafter_grid(dtype, k):
    """Every pairing of the edge values: ±0, ±1, the smallest subnormal and
    normal, the largest finite, ±inf and NaN."""
    info = torch.finfo(dtype)
    v = torch.tensor([0.0, -0.0, 1.0, -1.0, info.tiny, -info.tiny, info.max, -info.max,
                      float("inf"), float("-inf"), float("nan")], dtype=torch.float64)
    v = torch.cat([v.to(dtype), (torch.ones(1, dtype=dtype) * info.smallest_normal).nextafter(torch.zeros(1, dtype=dtype))])
    a, b = torch.meshgrid(v, v, indexing="ij")
    return [a.reshape(-1).contiguous(), b.reshape(-1).contiguous()]


def histogram_cases():
    """histogram beyond OpInfo's samples, hist and edges in one tensor: the
    data's range, a weighted density over a range, a point (widened by ½
    each side), and a range with elements below, above, on both edges and
    NaN."""
    def both(r):
        return torch.cat([r.hist, r.bin_edges])
    return [lambda x, w: both(torch.histogram(x, 7)),
            lambda x, w: both(torch.histogram(x, 5, range=(-2.0, 2.0), weight=w, density=True)),
            lambda x, w: both(torch.histogram(x * 0 + 1.5, 4)),
            lambda x, w: both(torch.histogram(x, 5, range=(-2.0, 2.0), weight=w))]


def histogram_data(dtype, k):
    x = rnd((6, 5), dtype)
    w = torch.rand(6, 5).to(dtype)
    if k == 3:
        x.view(-1)[:6] = torch.tensor([-2.0, 2.0, -2.5, 2.5, float("nan"), 0.8], dtype=dtype)
    return [x, w]


def histogramdd_cases():
    """histogramdd over 3-d points [4, 5, 3], hist and every axis's edges in
    one tensor: the data's ranges with per-axis counts, one count with
    ranges, weights and density, and edges given per axis."""
    def all_of(r):
        return torch.cat([r.hist.reshape(-1), *r.bin_edges])
    edges = [torch.tensor([-3.0, -1.0, 0.0, 2.5]), torch.tensor([-2.0, 2.0]), torch.tensor([-4.0, -1.0, 1.0, 4.0, 6.0])]
    return [lambda x, w: all_of(torch.histogramdd(x, [3, 4, 2])),
            lambda x, w: all_of(torch.histogramdd(x, 3, range=[-2.0, 2.0, -3.0, 3.0, -1.0, 4.0], weight=w, density=True)),
            lambda x, w: all_of(torch.histogramdd(x, [e.to(x.dtype) for e in edges], weight=w))]


def histogramdd_data(dtype, k):
    return [rnd((4, 5, 3), dtype), torch.rand(4, 5).to(dtype)]


def empty_permuted_written(x):
    """aten.empty_permuted (Core ATen's form of empty_like of a transposed
    tensor: the same strides) fully written before it is read."""
    y = x.transpose(1, 2)
    out = torch.empty_like(y)
    out.copy_(y * 2)
    return out + 1


def grouped_mm(x, w, offs):
    """transformers' MoE fallback (a library custom op kiln has built in)."""
    import transformers.integrations.moe  # noqa: F401 - registers transformers::grouped_mm_fallback
    return torch.ops.transformers.grouped_mm_fallback(x, w, offs)


def grouped_mm_data(dtype, k):
    """11 rows of 6 over 4 experts (3 → 5 outputs): an empty expert and two
    rows past the last offset, which the reference leaves zero."""
    offs = torch.tensor([3, 3, 7, 9], dtype=torch.int32 if k == 0 else torch.int64)
    return [rnd((11, 6), dtype, -4, 5), rnd((4, 6, 5), dtype, -4, 5), offs]


COMPOSITE = {
    "fft": ([f for f, _ in FFT_CASES], [shapes for _, shapes in FFT_CASES], ("f32", "f64")),
    "einsum": ([lambda *t, eq=eq: torch.einsum(eq, *t) for eq, _ in EINSUM_EQUATIONS], [shapes for _, shapes in EINSUM_EQUATIONS],
               ("f32", "f64", "f16", "bf16", "i64", "i8")),
    # In-place forms training IR keeps (EfficientNet's nn.Dropout(inplace=True) → aten.dropout_).
    "inplace": ([lambda x: torch.nn.functional.dropout(x * 2, 0.2, training=False, inplace=True)], [[(3, 4)]], ("f32",)),
    # bincount of int32/int64 with its length bounded in the program (OpInfo's samples leave it unbounded).
    "bincount": ([bounded_bincount], [[(12,)]], ("i64", "i32", "u8")),
    # erfinv over its whole domain (OpInfo samples only a few points), with its edges.
    "erfinv": ([torch.erfinv], [[(408,)]], ("f32", "f64"), lambda dtype, k: [erfinv_grid(dtype)]),
    "quantile": ([quantiles_with_nans], [[(5, 7)]], ("f32", "f64"), rows_with_nans),
    "bessel_k": ([bessel_k_all], [[(246,)]], ("f32", "f64"), bessel_k_grid),
    "ndtri": ([torch.special.ndtri], [[(329,)]], ("f32", "f64"), ndtri_grid),
    "airy": ([torch.special.airy_ai], [[(268,)]], ("f32", "f64"), airy_grid),
    "unique_dim": ([unique_slices], [[(8, 2, 3)]], ("f32", "i64"), repeated_rows),
    "segment_reduce": ([segments_without_initial], [[(7, 3), (5,)]], ("f32", "f64"), segment_data),
    "igamma": ([igamma_both], [None], ("f32", "f64"), igamma_grid),
    "histc": (histc_cases(), [[(6, 5)]] * 3, ("f32", "f64", "bf16"), histc_data),
    "grid_sample_3d": (grid_sample_3d_nearest(), [None] * 6, ("f32", "f64"), grid_3d_data),
    "nextafter": ([torch.nextafter], [None], ("f32", "f64", "f16", "bf16"), nextafter_grid),
    "histogram": (histogram_cases(), [None] * 4, ("f32", "f64"), histogram_data),
    "histogramdd": (histogramdd_cases(), [None] * 3, ("f32", "f64"), histogramdd_data),
    "empty_permuted": ([empty_permuted_written], [[(2, 3, 4, 5)]], ("f32", "i64")),
    "grouped_mm_fallback": ([grouped_mm, grouped_mm], [None, None], ("f32", "f64", "bf16", "i64"), grouped_mm_data),
    # linspace/logspace with steps (OpInfo's tensor-overload sample has none; the Scalar forms take no tensor), eye.
    "spaced": ([lambda s, e: torch.linspace(s, e, 9), lambda x: x + torch.linspace(-1.5, 2.0, 7, dtype=x.dtype),
                lambda s, e: torch.logspace(s, e, 6, base=2.0), lambda x: x * torch.logspace(-1.0, 1.5, 5, dtype=x.dtype),
                lambda x: x + torch.linspace(-7, 20, 7, dtype=torch.int64), lambda x: x + torch.eye(3, 4, dtype=x.dtype)],
               [[(), ()], [(7,)], [(), ()], [(5,)], [(7,)], [(3, 4)]], ("f32", "f64", "i64")),
}


def composite_cases(args, manifest, only):
    """Builds the COMPOSITE cases into args.out and manifest."""
    for name, (fns, shapes, dtypes, *make) in COMPOSITE.items():
        cname = f"{name}.extra"
        if only and cname not in only:
            continue
        shutil.rmtree(os.path.join(args.out, cname), ignore_errors=True)
        for dname in dtypes:
            dtype = DTYPES[dname]
            count = len(fns) if dname == "f32" or args.full else 1
            for k in range(count):
                torch.manual_seed(k)
                inputs = make[0](dtype, k) if make else [rnd(sh, dtype, -4, 5) for sh in shapes[k]]
                mod = DirectModule(fns[k]).eval()
                with torch.no_grad():
                    outputs = [mod(*inputs).detach().clone().contiguous()]
                ep, aten = export_case(mod, inputs, outputs)
                case = save_case(args.out, cname, dname, k, ep, aten, inputs, outputs, with_training=True)
                m = marks(cname, dname, f"{dname}_{k}", case["flavours"])
                if m:
                    case["unsupported"] = m
                manifest["cases"].append(case)
        print(f"{cname}: {sum(1 for c in manifest['cases'] if c['op'] == cname)} cases", file=sys.stderr)


def sweep_ops(op_db):
    """--all: every (name, variant) of op_db, in op_db's order. The question
    it answers is the issue's: of the OpInfo cases torch can export, how many
    does kiln compile and match, per flavour (see summarise)."""
    return [(o.name, o.variant_test_name) for o in op_db]


def summarise(manifest_path, results_path):
    """Prints, per flavour, the --all sweep's cases exported by torch, those
    kiln compiles and matches, those refused at compile time (with the ops
    named in kiln's error), mismatches and other failures; plus the samples
    torch itself could not export or kiln cannot take (complex dtypes).
    `results_path` is what tests/tests/e2e/conformance.rs writes with
    KILN_CONFORMANCE_RESULTS set. A case saved without training.pt2 (its
    training graph calls the same ops as Core ATen) counts its aten run
    for both flavours."""
    with open(manifest_path) as f:
        manifest = json.load(f)
    with open(results_path) as f:
        results = {(r["dir"], r["flavour"]): r for r in json.load(f)}
    summary = {}
    for flavour in ("training", "aten"):
        tally = {"exported": 0, "pass": 0, "unsupported": 0, "mismatch": 0, "other": 0}
        unsupported_ops, mismatches, others = {}, [], []
        for case in manifest["cases"]:
            run = results.get((case["dir"], flavour if flavour in case["flavours"] else "aten"))
            if run is None:
                continue
            tally["exported"] += 1
            status = run["status"]
            tally[status] += 1
            if status == "unsupported":
                for op in run.get("ops", []) or ["?"]:
                    unsupported_ops.setdefault(op, set()).add(case["dir"])
            elif status == "mismatch":
                mismatches.append(f"{case['dir']}: {run['detail']}")
            elif status == "other":
                others.append(f"{case['dir']}: {run['detail']}")
        share = 100.0 * tally["pass"] / max(tally["exported"], 1)
        print(f"## {flavour}: {tally['exported']} exported, {tally['pass']} pass ({share:.1f} %), "
              f"{tally['unsupported']} unsupported at compile time, {tally['mismatch']} mismatch, {tally['other']} other")
        for op, dirs in sorted(unsupported_ops.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            print(f"  unsupported {op}: {len(dirs)} cases (e.g. {sorted(dirs)[0]})")
        for line in mismatches + others:
            print(f"  FAIL {line}")
        summary[flavour] = dict(tally, unsupported_ops={op: len(d) for op, d in unsupported_ops.items()})
    reasons = {}
    for s in manifest["skipped"]:
        for part in s["why"].split("; "):
            key = part.rsplit(" (x", 1)[0][:80]
            reasons[key] = reasons.get(key, 0) + 1
    print("## samples not exported (op x dtype groups, by first reason)")
    for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {n:5d}  {why}")
    return summary


def k_of(b):
    """slice_scatter's sample index, read back from its src shape."""
    return int(b.shape[0] == 3)


def direct_cases(args, manifest, only, per_dtype, keep):
    """Builds the DIRECT cases into args.out and manifest."""
    for overload, (fn, make, dtypes) in DIRECT.items():
        cname = f"aten.{overload}"
        if only and cname not in only:
            continue
        shutil.rmtree(os.path.join(args.out, cname), ignore_errors=True)
        for dname, dtype in DTYPES.items():
            if (dtypes is not None and dname not in dtypes) or (keep and dname not in keep):
                continue
            want = 2 if dname == "f32" and not args.full and not args.per_dtype else max(per_dtype.get(dname, 0), 1)
            want = min(want, 2)  # two shapes per case at most
            for k in range(want):
                torch.manual_seed(k)
                inputs = [t.contiguous() for t in make(dtype, k)]
                mod = DirectModule(fn).eval()
                try:
                    with torch.no_grad():
                        outs, _ = pytree.tree_flatten(mod(*inputs))
                    outputs = [o.detach().clone().contiguous() for o in outs]
                    ep, aten = export_case(mod, inputs, outputs)
                except Exception as e:  # noqa: BLE001 - dtypes torch's CPU kernel lacks
                    manifest["skipped"].append({"op": cname, "dtype": dname, "why": f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"})
                    break
                if f"aten.{overload}" not in graph_targets(ep) + graph_targets(aten):
                    raise SystemExit(f"{cname}: neither exported graph calls the overload: {graph_targets(ep)}")
                case = save_case(args.out, cname, dname, k, ep, aten, inputs, outputs, with_training=True)
                case["overload"] = overload
                m = marks(cname, dname, f"{dname}_{k}", case["flavours"])
                if m:
                    case["unsupported"] = m
                manifest["cases"].append(case)
        print(f"{cname}: {sum(1 for c in manifest['cases'] if c['op'] == cname)} cases", file=sys.stderr)


class DirectModule(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *tensors):
        return self.fn(*tensors)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "cases"))
    ap.add_argument("--full", action="store_true", help="every dtype, more samples (local runs)")
    ap.add_argument("--ops", default="", help="comma-separated case names (e.g. cumsum,F.pad.reflect) to regenerate")
    ap.add_argument("--dtypes", default="", help="comma-separated dtypes (e.g. f64,i8) to generate, others skipped")
    ap.add_argument("--per-dtype", type=int, default=0, help="samples per dtype (overrides --full/committed counts)")
    ap.add_argument("--remark", action="store_true", help="only rewrite the known-unsupported marks in manifest.json")
    ap.add_argument("--all", action="store_true", help="every op_db entry, both flavours (local sweep; see sweep_ops)")
    ap.add_argument("--shard", default="", help="K/N: only the op entries whose index is K mod N (parallel --all runs into separate --out folders)")
    ap.add_argument("--summary", metavar="RESULTS", help="only summarise a conformance run's results.json against --out's manifest")
    args = ap.parse_args()
    if args.summary:
        summarise(os.path.join(args.out, "manifest.json"), args.summary)
        return
    if args.remark:
        path = os.path.join(args.out, "manifest.json")
        with open(path) as f:
            manifest = json.load(f)
        for case in manifest["cases"]:
            case.pop("unsupported", None)
            m = marks(case["op"], case["dtype"], case["dir"].rsplit("/", 1)[-1], case["flavours"])
            if m:
                case["unsupported"] = m
        write_manifest(path, manifest)
        return
    from torch.testing._internal.common_methods_invocations import op_db

    per_dtype = dict(FULL if args.full else SWEEP if args.all else COMMITTED)
    committed = not args.full and not args.per_dtype and not args.all  # EXTRA applies to the committed subset only
    if args.per_dtype:
        per_dtype = {d: args.per_dtype for d in DTYPES}
    keep = set(filter(None, args.dtypes.split(",")))
    if keep:
        per_dtype = {d: n for d, n in per_dtype.items() if d in keep}
    by_key = {(o.name, o.variant_test_name): o for o in op_db}
    only = set(filter(None, args.ops.split(",")))
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = kept_entries(manifest_path, only, "op", ("cases", "skipped"), keep)
    os.makedirs(args.out, exist_ok=True)

    entries = sweep_ops(op_db) if args.all else OPS
    if args.shard:
        k, n = (int(v) for v in args.shard.split("/"))
        entries = [e for i, e in enumerate(entries) if i % n == k]
    for name, variant in entries:
        cname = case_name(name, variant)
        if only and cname not in only:
            continue
        op = by_key.get((name, variant))
        if op is None:
            manifest["skipped"].append({"op": cname, "dtype": "*", "why": "no such OpInfo in this torch"})
            continue
        if keep:  # only these dtypes' cases are regenerated
            for dname in keep:
                for sub in glob.glob(os.path.join(args.out, cname, f"{dname}_*")):
                    shutil.rmtree(sub)
        else:
            shutil.rmtree(os.path.join(args.out, cname), ignore_errors=True)
        supported = op.supported_dtypes("cpu")
        for dname, dtype in DTYPES.items():
            want = per_dtype.get(dname, 0)
            if committed and cname in FEW:
                want = min(want, FEW[cname].get(dname, 0))
            if committed and dname in EXTRA.get(cname, ()) and (not keep or dname in keep):
                want = max(want, 2 if dname in EXTRA_TWO.get(cname, ()) else 1)
            if want == 0 or dtype not in supported:
                continue
            torch.manual_seed(0)
            made, reasons = 0, {}
            try:
                samples = op.sample_inputs("cpu", dtype, requires_grad=False)
                if cname in PICK:
                    samples = list(samples)
                    first = [samples[i] for i in PICK[cname] if i < len(samples)]
                    samples = first + [s for i, s in enumerate(samples) if i not in PICK[cname]]
                samples = iter(samples)
            except Exception as e:  # noqa: BLE001
                manifest["skipped"].append({"op": cname, "dtype": dname, "why": f"sample_inputs failed: {e}"})
                continue
            while made < want:
                try:
                    sample = next(samples)
                except StopIteration:
                    break
                except Exception as e:  # noqa: BLE001 - a sample generator failing midway
                    why = f"sample_inputs failed: {type(e).__name__}"
                    reasons[why] = reasons.get(why, 0) + 1
                    break
                try:
                    mod, inputs, outputs = build_case(op, sample)
                    ep, aten = export_case(mod, inputs, outputs)
                except ValueError as e:
                    reasons[str(e)] = reasons.get(str(e), 0) + 1
                    continue
                except Exception as e:  # noqa: BLE001 - eager failures on odd samples
                    why = f"eager failed: {type(e).__name__}"
                    reasons[why] = reasons.get(why, 0) + 1
                    continue
                case = save_case(args.out, cname, dname, made, ep, aten, inputs, outputs,
                                 with_training=args.full or args.all or dname in ("f32", "c64"))
                ties = tie_order(cname, sample)
                if ties:
                    case["ties"] = ties
                signs = sign_groups(cname, outputs)
                if signs:
                    case["signs"] = signs
                if cname in UNINITIALIZED:
                    case["uninitialized"] = True
                m = marks(cname, dname, f"{dname}_{made}", case["flavours"])
                if m:
                    case["unsupported"] = m
                manifest["cases"].append(case)
                made += 1
            if made < want and reasons:
                manifest["skipped"].append({"op": cname, "dtype": dname, "why": "; ".join(f"{k} (x{v})" for k, v in sorted(reasons.items()))})
        print(f"{cname}: {sum(1 for c in manifest['cases'] if c['op'] == cname)} cases", file=sys.stderr)
        if args.all:  # a long sweep: what is done so far survives an interruption
            write_manifest(manifest_path, manifest)

    if not args.all:
        direct_cases(args, manifest, only, per_dtype, keep)
        composite_cases(args, manifest, only)
    manifest["cases"].sort(key=lambda c: c["dir"])
    manifest["torch"] = torch.__version__
    write_manifest(manifest_path, manifest)


if __name__ == "__main__":
    main()
