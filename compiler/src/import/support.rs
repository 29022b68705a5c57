//! The support table: which ATen ops the importer converts, for which
//! dtypes, with what limits — printed by `kiln ops` and rendered into
//! `compiler/OPS.md` (a test fails when either drifts from the code).
//!
//! Every name the importer's `dispatch` matches must appear here and vice
//! versa (checked by a test over `import/ops/mod.rs`). `CORE_ATEN` is the
//! Core ATen opset of torch 2.15 (`torch.Tag.core`), for the coverage count.

/// One row of the support table.
#[derive(Copy, Clone, Debug)]
pub struct OpSupport {
    /// ATen op names (without the `aten.` namespace); `name.overload` when
    /// only that overload is handled.
    pub names: &'static [&'static str],
    /// The dtypes kiln runs it for.
    pub dtypes: &'static [&'static str],
    /// Limits, or how the op is computed.
    pub note: &'static str,
}

const DT_FLOAT: &[&str] = &["f32", "f64", "f16", "bf16"];
const DT_NUMERIC: &[&str] = &["f32", "f64", "f16", "bf16", "i64", "i32", "i16", "i8", "u8"];
const DT_ALL: &[&str] = &["f32", "f64", "f16", "bf16", "i64", "i32", "i16", "i8", "u8", "bool"];
const DT_NONE: &[&str] = &[];
const DT_INT: &[&str] = &["i64", "i32", "i16", "i8", "u8"];
const DT_FLOAT_U8: &[&str] = &["f32", "f64", "f16", "bf16", "u8"];

/// The ops the importer converts.
pub fn supported_ops() -> &'static [OpSupport] {
    SUPPORTED
}

const SUPPORTED: &[OpSupport] = &[
    OpSupport { names: &["linear", "addmm", "mm", "bmm", "matmul"], dtypes: DT_NUMERIC, note: "f16/bf16 computed in f32, integers in f64" },
    OpSupport { names: &["_int_mm"], dtypes: &["i8", "u8"], note: "int8 (or uint8) x int8 -> exact int32 sums (torchao's decomposed dynamic quantization)" },
    OpSupport { names: &["einsum"], dtypes: DT_NUMERIC, note: "training IR: diagonals, `...` broadcasting, implicit output; operands contracted left to right as batched matmuls" },
    OpSupport { names: &["convolution", "_convolution", "conv1d", "conv2d", "conv3d"], dtypes: DT_NUMERIC, note: "f16/bf16 in f32, integers in f64; transposed too" },
    OpSupport { names: &["conv_transpose1d", "conv_transpose2d", "conv_transpose3d"], dtypes: DT_NUMERIC, note: "spread + pad + flipped-weight convolution; f16 (and bf16 with output_padding >= stride) follow torch's GEMM + col2im rounding (taps summed in the dtype), static sizes" },
    OpSupport { names: &["batch_norm", "_native_batch_norm_legit_no_training"], dtypes: DT_FLOAT, note: "running statistics, or the batch's with training=True (decomposed)" },
    OpSupport { names: &["_cdist_forward", "cdist", "_pdist_forward", "pdist"], dtypes: DT_FLOAT, note: "any p >= 0 (0, 1, 2, inf, general); cdist p=2 takes torch's matrix-product form when compute_mode asks or a side has > 25 rows; pdist needs a static shape" },
    OpSupport { names: &["grid_sampler_2d", "grid_sampler"], dtypes: DT_FLOAT, note: "bilinear/nearest/bicubic, zeros/border/reflection padding, align_corners; static input height and width" },
    OpSupport { names: &["histogram", "histogramdd", "_histogramdd_bin_edges", "_histogramdd_from_bin_cts", "_histogramdd_from_bin_tensors"], dtypes: &["f32", "f64"], note: "bin counts (range, weight, density; the data's range when none) or tensors of edges of static length; hist and bin_edges as torch's CPU kernel finds them; histogramdd over a static number of points" },
    OpSupport { names: &["grid_sampler_3d"], dtypes: DT_FLOAT, note: "trilinear/nearest, zeros/border/reflection padding, align_corners (torch's scalar 3-d kernel); static input depth, height and width" },
    OpSupport { names: &["_native_batch_norm_legit", "_native_batch_norm_legit_functional"], dtypes: DT_FLOAT, note: "training mode: the batch's statistics (decomposed; f16/bf16 in f32); save_mean/save_rstd and updated running statistics computed when read" },
    OpSupport { names: &["layer_norm", "native_layer_norm"], dtypes: DT_FLOAT, note: "saved mean/rstd outputs must be unused" },
    OpSupport { names: &["group_norm", "native_group_norm"], dtypes: DT_FLOAT, note: "static channel count (batch and spatial dims may be dynamic); saved statistics must be unused" },
    OpSupport { names: &["rms_norm"], dtypes: DT_FLOAT, note: "" },
    OpSupport { names: &["softmax", "_softmax", "log_softmax", "_log_softmax"], dtypes: DT_FLOAT, note: "f16/bf16 in f32; last-dim log_softmax rounds the row sum and its log to the dtype, as torch does" },
    OpSupport { names: &["max_pool2d", "max_pool2d_with_indices", "max_pool1d", "max_pool1d_with_indices"], dtypes: DT_NUMERIC, note: "indices are computed on the CPU under --target pjrt" },
    OpSupport { names: &["avg_pool2d", "avg_pool1d"], dtypes: DT_NUMERIC, note: "" },
    OpSupport { names: &["adaptive_avg_pool2d", "_adaptive_avg_pool2d", "adaptive_avg_pool1d"], dtypes: DT_FLOAT, note: "1-d as the 2-d pool over `[.., 1, L]`" },
    OpSupport { names: &["scaled_dot_product_attention"], dtypes: DT_FLOAT, note: "no dropout; grouped-query heads with static counts" },
    OpSupport { names: &["relu", "gelu", "silu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "erf", "erfc", "sin", "cos", "reciprocal", "log1p", "expm1", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "log2", "log10", "arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh"], dtypes: DT_FLOAT, note: "integer inputs are promoted to float" },
    OpSupport { names: &["lgamma", "digamma", "special_digamma", "special_psi", "i0", "special_i0", "special_i0e", "special_i1", "special_i1e", "special_erfcx", "special_ndtr", "special_log_ndtr", "special_bessel_j0", "special_bessel_j1", "special_bessel_y0", "special_bessel_y1", "special_entr", "special_spherical_bessel_j0", "special_modified_bessel_i0", "special_modified_bessel_i1"], dtypes: DT_FLOAT, note: "computed in f64 and rounded once (ndtr on f16/bf16 rounds every step, as torch does); CPU only; near the zeros of J0/Y1 (x ≈ 5.5) torch's own port is off by up to 4e-7 absolute where kiln agrees with scipy's Cephes, so f64 comparisons there fail at torch's tolerance" },
    OpSupport { names: &["nextafter"], dtypes: DT_FLOAT, note: "C's nextafter, bit for bit: one ulp of the dtype towards `other` (f16 and bf16 step their own ulps)" },
    OpSupport { names: &["igamma", "igammac", "special_gammainc", "special_gammaincc"], dtypes: DT_FLOAT, note: "regularized incomplete gamma P(a, x), Q(a, x) in f64 (torch's Cephes special values and regimes: series, small-x series for Q, continued fraction; plain iterations where torch uses its asymptotic series for a ≈ x), rounded once; under --target pjrt the same iterations as f64 `stablehlo.while` loops" },
    OpSupport { names: &["polygamma", "special_polygamma", "special_zeta"], dtypes: DT_NUMERIC, note: "Hurwitz ζ by torch's (Cephes') Euler–Maclaurin summation in f64, rounded once; polygamma: digamma, torch's trigamma, and (-1)^(n+1) n! ζ(n+1, x) above; integers promoted to f32" },
    OpSupport { names: &["neg", "negative", "abs", "absolute", "floor", "ceil", "round", "trunc", "fix", "sign"], dtypes: DT_NUMERIC, note: "round with decimals as torch's CPU kernel (rint of x·10^d in the math dtype)" },
    OpSupport { names: &["logical_not", "bitwise_not"], dtypes: DT_ALL, note: "" },
    OpSupport { names: &["hardtanh", "relu6", "clamp", "clamp_min", "clamp_max"], dtypes: DT_NUMERIC, note: "scalar or tensor bounds" },
    OpSupport { names: &["hardswish", "hardsigmoid", "mish", "softplus", "leaky_relu", "elu", "square"], dtypes: DT_FLOAT, note: "decomposed at import (f16/bf16 in f32)" },
    OpSupport { names: &["isnan", "isinf"], dtypes: DT_ALL, note: "" },
    OpSupport { names: &["add", "sub", "rsub", "mul", "div", "remainder", "floor_divide", "pow", "maximum", "minimum", "fmod", "atan2", "arctan2"], dtypes: DT_NUMERIC, note: "torch type promotion; integer div by zero is a run-time error" },
    OpSupport { names: &["special_chebyshev_polynomial_t", "special_chebyshev_polynomial_u", "special_chebyshev_polynomial_v", "special_chebyshev_polynomial_w", "special_shifted_chebyshev_polynomial_t", "special_shifted_chebyshev_polynomial_u", "special_shifted_chebyshev_polynomial_v", "special_shifted_chebyshev_polynomial_w", "special_hermite_polynomial_h", "special_hermite_polynomial_he", "special_laguerre_polynomial_l", "special_legendre_polynomial_p"], dtypes: &["f32", "f64", "i64", "i32", "i16", "i8", "u8", "bool"], note: "torch's recurrences and trigonometric forms step for step in the float dtype (integers promoted to f32); n from the tensor, truncated as torch casts it" },
    OpSupport { names: &["eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "__and__", "__or__", "__xor__"], dtypes: DT_ALL, note: "" },
    OpSupport { names: &["bitwise_left_shift", "bitwise_right_shift", "__lshift__", "__rshift__"], dtypes: DT_INT, note: "as multiplication/floor division by powers of two; shifts outside 0..bits give torch's answer (0, or the sign for signed right shifts)" },
    OpSupport { names: &["where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar", "masked_fill"], dtypes: DT_ALL, note: "" },
    OpSupport { names: &["mean", "sum", "amax", "amin", "prod", "any"], dtypes: DT_ALL, note: "" },
    OpSupport { names: &["max.dim", "min.dim", "max.default", "min.default", "argmax", "argmin"], dtypes: DT_NUMERIC, note: "" },
    OpSupport { names: &["cumsum"], dtypes: DT_ALL, note: "" },
    OpSupport { names: &["cumprod", "cummax", "cummin"], dtypes: DT_ALL, note: "torch's CPU accumulation (f64 for f32/f64, f32 for f16/bf16, wrapping i64); cummax/cummin take NaN at once and the last index among ties" },
    OpSupport { names: &["logcumsumexp"], dtypes: DT_FLOAT, note: "torch's log1p(exp(min - max)) + max, in f64 for f32/f64" },
    OpSupport { names: &["linalg_inv", "linalg_inv_ex", "linalg_det", "_linalg_det", "linalg_slogdet", "_linalg_slogdet", "logdet", "linalg_solve", "linalg_solve_ex", "_linalg_solve_ex", "linalg_lu_factor", "linalg_lu_factor_ex"], dtypes: &["f32", "f64"], note: "LU with partial pivoting (LAPACK getrf's pivots) in f64; a singular matrix fails the run where torch raises; complex64/complex128 too: det/slogdet/logdet/lu_factor in complex f64 with zgetrf's |re| + |im| pivots and slogdet's sign a unit complex number, inv/solve through the real embedding [[A, −B], [B, A]]" },
    OpSupport { names: &["linalg_ldl_factor", "linalg_ldl_factor_ex", "linalg_ldl_solve"], dtypes: &["f32", "f64"], note: "LDLᵀ of the lower triangle with Bunch–Kaufman pivoting, as LAPACK's sytf2/sytrs (the same pivot tests, interchanges and 1×1/2×2 blocks; torch's pivots), in f64; hermitian is the same for real matrices; pivots that describe no factorization fail the run; complex: the symmetric zsytf2/zsytrs (hermitian=True, zhetrf, is refused)" },
    OpSupport { names: &["linalg_cholesky", "linalg_cholesky_ex", "cholesky_solve", "linalg_solve_triangular", "linalg_qr"], dtypes: &["f32", "f64"], note: "in f64; cholesky of a matrix that is not positive definite fails the run where torch raises; qr with LAPACK's Householder signs; complex: A = L Lᴴ (zpotrf), conjugate transposes in the solves, zgeqrf's complex tau and real diagonal of R" },
    OpSupport { names: &["linalg_eigvalsh", "linalg_eigh", "_linalg_eigh"], dtypes: &["f32", "f64"], note: "Jacobi in f64; eigenvectors with kiln's signs (each column's largest entry positive; LAPACK's are an accident of its algorithm); complex Hermitian too (eigenvalues through the real embedding, eigenvectors by complex Jacobi with each column's largest entry real and positive)" },
    OpSupport { names: &["_linalg_svd", "linalg_svd", "svd", "linalg_svdvals"], dtypes: &["f32", "f64"], note: "one-sided Jacobi in f64; singular vector pairs with kiln's signs (the shorter side's vectors have their largest entry positive); full_matrices completes the bases; complex too (complex Jacobi, the shorter side's largest entry real and positive; svdvals through the real embedding)" },
    OpSupport { names: &["linalg_pinv", "pinverse", "linalg_matrix_rank"], dtypes: &["f32", "f64"], note: "torch's formulas (SVD, or eigh with hermitian) and tolerances (atol, rtol, rcond, tol; tensors or floats); complex: pinv and matrix_rank through the real embedding, a Hermitian pinv from the complex eigh" },
    OpSupport { names: &["linalg_matrix_power", "triangular_solve", "cholesky_inverse", "linalg_tensorinv", "linalg_tensorsolve", "linalg_lu", "lu_unpack", "linalg_lu_solve", "lu_solve", "_lu_with_info", "geqrf", "linalg_householder_product", "orgqr", "ormqr"], dtypes: &["f32", "f64"], note: "torch's definitions on the LU/Cholesky/triangular kernels (matrix_power by torch's binary decomposition; a singular matrix fails the run where torch raises); complex too (matrix_power through the real embedding)" },
    OpSupport { names: &["linalg_matrix_norm", "linalg_norm", "nuclear_norm", "linalg_cond"], dtypes: &["f32", "f64"], note: "torch's definitions: fro, nuc, ±1, ±2, ±inf (2 and nuc from the singular values); cond's inverse through LU, a singular matrix giving inf" },
    OpSupport { names: &["divide", "subtract", "sgn", "mH", "matrix_H", "linalg_diagonal", "unsafe_split", "vsplit", "hsplit", "dsplit", "movedim", "atleast_1d", "atleast_2d", "atleast_3d", "diagflat", "feature_alpha_dropout"], dtypes: DT_ALL, note: "aliases of ops kiln converts (the conjugates of real tensors are the identity); splits by their declared piece shapes; feature_alpha_dropout with train=False" },
    OpSupport { names: &["msort", "argsort"], dtypes: DT_NUMERIC, note: "a stable sort's values (dim 0) or indices" },
    OpSupport { names: &["take", "put", "as_strided_scatter", "_unsafe_masked_index", "_unsafe_masked_index_put_accumulate"], dtypes: DT_ALL, note: "flat gathers and scatters (negative indices count from the end, out of range fails the run); as_strided_scatter's positions are compile-time constants; the masked ops clamp their indices as their decompositions do" },
    OpSupport { names: &["isin", "isposinf", "isneginf", "isreal"], dtypes: DT_ALL, note: "isin compares every element with every test element" },
    OpSupport { names: &["special_xlog1py", "nanmean", "linalg_vecdot", "linalg_multi_dot", "cross", "_safe_softmax", "_chunk_cat", "fft_fftshift", "fft_ifftshift"], dtypes: DT_FLOAT, note: "torch's references; multi_dot multiplies left to right; cross without dim takes the first dim of size 3" },
    OpSupport { names: &["eye"], dtypes: DT_ALL, note: "ones on the diagonal, static sizes" },
    OpSupport { names: &["linspace", "logspace"], dtypes: DT_NUMERIC, note: "every overload (0-d tensor start/end included), torch's CPU kernel: the first half counted from start, the second from end" },
    OpSupport { names: &["max_unpool2d", "max_unpool3d", "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "bilinear", "_trilinear"], dtypes: DT_FLOAT, note: "max_unpool as torch's flat index_put (an index outside its plane fails the run); adaptive max pooling as a gather of every output's window and a max (indices: the first arg-max's position in the plane); bilinear as one GEMM and a product-sum" },
    OpSupport { names: &["trapz", "trapezoid", "cumulative_trapezoid", "linalg_vander", "renorm", "gradient"], dtypes: DT_NUMERIC, note: "torch's C++ formulas (trapezoid with sample points or a spacing; vander as a cumulative product; renorm by the p-norm of each slice; gradient with uniform spacings, edge orders 1 and 2)" },
    OpSupport { names: &["multi_margin_loss", "multilabel_margin_loss", "multilabel_margin_loss_forward"], dtypes: &["f32", "f64"], note: "torch's decompositions: p 1 and 2, margin, per-class weight, every reduction; `_forward` also returns the target mask" },
    OpSupport { names: &["cosine_embedding_loss", "margin_ranking_loss", "soft_margin_loss", "hinge_embedding_loss", "poisson_nll_loss", "triplet_margin_loss"], dtypes: DT_FLOAT, note: "torch's references in the math dtype (f32 for f16/bf16), every reduction" },
    OpSupport { names: &["mvlgamma"], dtypes: DT_NUMERIC, note: "torch's sum of lgammas (integers promote to f32); an element not above (p-1)/2 fails the run" },
    OpSupport { names: &["native_dropout_backward", "_softmax_backward_data", "_log_softmax_backward_data"], dtypes: DT_FLOAT, note: "the two backward ops whose formulas are one line (torch's decompositions); other gradients are refused" },
    OpSupport { names: &["zero", "new_empty_strided", "resize", "resize_as"], dtypes: DT_ALL, note: "zero_ as zeros; new_empty_strided as zeros (torch leaves it uninitialised); resize_/resize_as_ to at most the elements there are (growing would read uninitialised memory)" },
    OpSupport { names: &["diff"], dtypes: DT_ALL, note: "a dynamic length along `dim` must be at least `n` at its lower bound" },
    OpSupport { names: &["sort", "topk"], dtypes: DT_NUMERIC, note: "stable; among tied values topk's index order may differ from torch's (whose order is its C++ library's)" },
    OpSupport { names: &["var", "std"], dtypes: DT_FLOAT, note: "computed in f64" },
    OpSupport { names: &["view", "_unsafe_view", "reshape", "flatten", "unflatten", "unsqueeze", "squeeze", "view_as", "reshape_as", "expand", "expand_as", "t", "transpose", "permute", "numpy_T", "mT", "swapaxes", "swapdims", "movedim.int", "moveaxis.int"], dtypes: DT_ALL, note: "training IR's in-place writes through views (also slice/select/narrow/split/diagonal) are scattered back into the base; not through expand or as_strided" },
    OpSupport { names: &["alias", "clone", "contiguous", "detach", "lift_fresh_copy", "_to_copy", "to", "type_as", "copy"], dtypes: DT_ALL, note: "" },
    OpSupport { names: &["dropout", "feature_dropout", "alpha_dropout", "native_dropout"], dtypes: DT_ALL, note: "dropout/native_dropout in training mode on floats draw from the session's generator (distribution-tested); feature/alpha dropout inference only" },
    OpSupport { names: &["slice", "select", "narrow", "cat", "concat", "concatenate", "split", "split_with_sizes", "chunk", "unbind", "tensor_split"], dtypes: DT_ALL, note: "" },
    OpSupport { names: &["embedding", "index_select", "index.Tensor", "_unsafe_index.Tensor"], dtypes: DT_ALL, note: "index.Tensor: several index tensors (broadcast, None slots); a run-time boolean mask alone goes through nonzero (data-dependent size), other masks only as constants" },
    OpSupport { names: &["arange", "full", "zeros", "ones", "empty", "empty_strided", "full_like", "zeros_like", "ones_like", "empty_like", "new_zeros", "new_ones", "new_full", "new_empty", "scalar_tensor", "fill"], dtypes: DT_ALL, note: "" },
    OpSupport { names: &["repeat", "flip", "tril", "triu"], dtypes: DT_ALL, note: "" },
    OpSupport { names: &["constant_pad_nd", "pad", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d", "replication_pad3d"], dtypes: DT_ALL, note: "pad modes constant/reflect/replicate/circular" },
    OpSupport { names: &["upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d"], dtypes: DT_NUMERIC, note: "nearest and (bi/tri)linear; uint8 bilinear in torch's x86 fixed-point arithmetic" },
    OpSupport { names: &["_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d"], dtypes: DT_FLOAT_U8, note: "gathers at index constants computed as torch's kernel does; static spatial sizes" },
    OpSupport { names: &["upsample_bicubic2d"], dtypes: DT_FLOAT_U8, note: "A = -0.75, border-clamped taps, align_corners; gathers and weight constants computed as torch's CPU kernels do (f16/bf16 weights rounded to the dtype, sums in f32; uint8 in its fixed-point arithmetic); static spatial sizes" },
    OpSupport { names: &["sym_size", "sym_numel", "sym_stride", "sym_storage_offset"], dtypes: DT_NONE, note: "shape arithmetic; strides are contiguous, storage offsets 0" },
    OpSupport { names: &["nonzero", "nonzero_numpy", "argwhere", "nonzero_static"], dtypes: DT_ALL, note: "data-dependent size: counted and bound at run time (CPU), memory planned for the input's element count" },
    OpSupport { names: &["_unique2", "unique_consecutive", "unique_dim"], dtypes: DT_ALL, note: "data-dependent size bound at run time like nonzero's (at most the input's length); stable sort (NaN last, each NaN distinct), run starts, inverse by scatter, counts by scatter-add; along a dim: slices compared whole, sorted lexicographically by one stable sort per element position (static slices of at most 1024 elements)" },
    OpSupport { names: &["bincount"], dtypes: DT_INT, note: "data-dependent length max(max + 1, minlength) bound at run time; memory for its upper bound: the program's `torch._check(out.size(0) <= N)`, else uint8 256, int8 128, int16 32768 (int32/int64 without a bound refused); weights summed in the output dtype" },
    OpSupport { names: &["_local_scalar_dense", "item"], dtypes: DT_ALL, note: "`.item()`: as an operand of arithmetic, read as a 0-d tensor; as a size, bound at run time within its `torch._check` bounds (an upper bound is required); other uses need compile-time values" },
    OpSupport { names: &["take_along_dim"], dtypes: DT_ALL, note: "a broadcast gather; negative indices count from the end" },
    OpSupport { names: &["index_add", "index_copy", "index_fill"], dtypes: DT_ALL, note: "index_put along one dim (index_add accumulates duplicates); index at most 1-d" },
    OpSupport { names: &["segment_reduce"], dtypes: DT_FLOAT, note: "sum/mean/max/min/prod over 1-d lengths or offsets along axis 0, with initial: one scatter into the segments; lengths checked at run time (non-negative, summing to the rows)" },
    OpSupport { names: &["index_reduce"], dtypes: DT_NUMERIC, note: "prod/mean/amax/amin, include_self or not: scatter_reduce along one dim with the index broadcast over the source; index at most 1-d" },
    OpSupport { names: &["pixel_shuffle", "pixel_unshuffle"], dtypes: DT_ALL, note: "reshape, permute, reshape" },
    OpSupport { names: &["im2col"], dtypes: DT_ALL, note: "`F.unfold`: zero padding and a gather at patch-position constants; static height and width" },
    OpSupport { names: &["unfold"], dtypes: DT_ALL, note: "`Tensor.unfold`: a gather at window-position constants; the unfolded dim must be static" },
    OpSupport { names: &["_fft_r2c", "_fft_c2r", "_fft_c2c", "fft_rfft", "fft_irfft", "fft_fft", "fft_ifft", "fft_rfft2", "fft_irfft2", "fft_fft2", "fft_ifft2", "fft_rfftn", "fft_irfftn", "fft_fftn", "fft_ifftn", "fft_hfft", "fft_hfft2", "fft_hfftn", "fft_ihfft", "fft_ihfft2", "fft_ihfftn", "stft", "istft"], dtypes: &["f32", "f64"], note: "DFT by matrix product (f64 cos/sin constants, one `Linear` per transformed dim), O(n²) per dim; transformed dims static; complex values are a pair of real values each inside the program; complex64/complex128 program inputs and outputs are the pairs' bytes (f32/f64 with a last dim of 2); stft/istft: win_length = n_fft, real or complex signals, return_complex=False as view_as_real's pairs; istft's NOLA condition checked at run time" },
    OpSupport { names: &["view_as_real", "view_as_complex", "complex", "polar", "real", "imag", "angle", "conj", "_conj", "conj_physical", "_conj_physical", "resolve_conj", "resolve_neg"], dtypes: &["f32", "f64"], note: "on complex values (program inputs, FFT results, complex parameters; the elementwise math in f64 (roots, logarithms, trigonometric and hyperbolic functions, pow), the real op per part or on bilinear pairs, the log-sum-exp family as torch's helper, factorizations on the complex linalg kernel: see README's complex sweep); on real tensors as torch defines them" },
    OpSupport { names: &["hann_window"], dtypes: DT_FLOAT, note: "a compile-time constant" },
    OpSupport { names: &["masked_select"], dtypes: DT_ALL, note: "data-dependent size: through nonzero of the broadcast mask (CPU)" },
    OpSupport { names: &["gather", "scatter", "scatter_add", "scatter_reduce"], dtypes: DT_ALL, note: "scatter_reduce: sum/prod/mean/amax/amin, include_self; out-of-range indices are a run-time error" },
    OpSupport { names: &["index_put", "_unsafe_index_put"], dtypes: DT_ALL, note: "accumulate or not; several index tensors; a run-time boolean mask alone (values: one per true position, checked at run time, or broadcast)" },
    OpSupport { names: &["select_scatter", "slice_scatter", "masked_scatter"], dtypes: DT_ALL, note: "a negative slice_scatter start on a dynamic dim needs the dim's lower bound to reach it; masked_scatter: source must not be empty" },
    OpSupport { names: &["diagonal", "diagonal_scatter", "as_strided", "col2im"], dtypes: DT_ALL, note: "as_strided, col2im: static shapes; diagonal(_scatter): dynamic dims when torch states the length without a min of unrelated sizes (square matrices)" },
    OpSupport { names: &["embedding_bag", "_embedding_bag", "_embedding_bag_forward_only"], dtypes: DT_FLOAT, note: "sum/mean/max, per_sample_weights, padding_idx, include_last_offset; 1-d indices and offsets; outputs 1..3 must be unused; f16/bf16 in torch's CPU arithmetic bit for bit (f32 accumulation rounded once, fbgemm's bf16 rounding on its fast path)" },
    OpSupport { names: &["embedding_renorm"], dtypes: DT_FLOAT, note: "`max_norm` of F.embedding/F.embedding_bag: the renormed weight is what later reads see (the training IR's in-place form through `detach`/`alias` of the weight too)" },
    OpSupport { names: &["avg_pool3d", "max_pool3d", "max_pool3d_with_indices", "adaptive_avg_pool3d", "_adaptive_avg_pool3d"], dtypes: DT_FLOAT, note: "max_pool3d indices are computed on the CPU under --target pjrt" },
    OpSupport { names: &["rand", "rand_like", "randn", "randn_like", "uniform", "normal", "normal_functional", "bernoulli", "randint", "randint_like", "randperm"], dtypes: DT_NUMERIC, note: "seeded counter-based generator (Philox4x32) per session: torch's distributions, not its values (distribution-tested); floats only except randint/randperm" },
    // What training IR keeps and Core ATen decomposes (import/ops/composite.rs).
    OpSupport { names: &["true_divide", "max.other", "min.other", "mv", "broadcast_to", "positive", "ravel", "fliplr", "flipud", "tile"], dtypes: DT_ALL, note: "aliases of div, maximum, minimum, matmul, expand, alias, reshape, flip, repeat" },
    OpSupport { names: &["var_mean", "std_mean"], dtypes: DT_FLOAT, note: "computed in f64, as var/std" },
    OpSupport { names: &["fmax", "fmin", "exp2", "frac", "deg2rad", "rad2deg", "sinc", "log_sigmoid", "selu", "celu", "logit", "softshrink", "hardshrink", "threshold", "copysign", "hypot", "logaddexp", "logaddexp2", "xlogy", "heaviside", "float_power", "addcmul", "addcdiv", "lerp", "prelu", "glu"], dtypes: DT_NUMERIC, note: "decomposed at import as torch's references define them (f16/bf16 in f32, float_power in f64); integer inputs promoted as torch does" },
    OpSupport { names: &["signbit", "nan_to_num", "isfinite", "isclose"], dtypes: DT_ALL, note: "signbit reads a NaN's sign bit as clear (-0.0 is seen)" },
    OpSupport { names: &["logsumexp", "linalg_vector_norm", "dist", "aminmax", "count_nonzero", "all", "nansum", "trace"], dtypes: DT_ALL, note: "norms: any order (0, 1, 2, ±inf, general p); logsumexp shifted by the maximum" },
    OpSupport { names: &["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "binary_cross_entropy", "binary_cross_entropy_with_logits", "nll_loss_nd", "nll_loss", "cross_entropy_loss", "cosine_similarity", "pairwise_distance", "instance_norm"], dtypes: DT_FLOAT, note: "reductions none/mean/sum; nll/cross_entropy: weights and ignore_index, label smoothing with class probabilities only" },
    OpSupport { names: &["stack", "hstack", "vstack", "dstack", "column_stack", "roll", "rot90", "broadcast_tensors", "channel_shuffle", "repeat_interleave.self_int", "linalg_cross", "block_diag", "diag", "diag_embed", "kron"], dtypes: DT_ALL, note: "rolled, halved, shuffled and diagonal axes need static sizes; diag_embed: the new axes last" },
    OpSupport { names: &["histc"], dtypes: DT_FLOAT, note: "torch's linear binning (⌊(x - min)·bins / (max - min)⌋, the top edge in the last bin), counted by one scatter-add; the data's range when min = max (any equal pair, as torch), a point range widened by one each side; NaN and out-of-range elements left out; a non-finite data range fails the run, a non-finite given range the compile; integer input refused (torch's CPU kernel takes floats)" },
    OpSupport { names: &["empty_permuted"], dtypes: DT_ALL, note: "as empty (contiguous, zeros; the values and the physical layout are unspecified in torch, so no program observes them); physical_layout checked to be a permutation" },
    OpSupport { names: &["dot", "inner", "outer", "vdot", "addmv", "baddbmm", "tensordot"], dtypes: DT_NUMERIC, note: "as matmul (f16/bf16 in f32, integers in f64); vdot of real tensors is dot" },
    // More of what training IR keeps, from the --all sweep (import/ops/training_ir.rs, selection.rs, number.rs).
    OpSupport { names: &["alias_copy", "as_strided_copy", "diagonal_copy", "expand_copy", "narrow_copy", "permute_copy", "select_copy", "slice_copy", "split_copy", "split_with_sizes_copy", "squeeze_copy", "t_copy", "transpose_copy", "unbind_copy", "unfold_copy", "unsqueeze_copy", "view_copy"], dtypes: DT_ALL, note: "the view op's value in new storage: in-place writes into the copy or its input do not reach the other" },
    OpSupport { names: &["meshgrid", "cartesian_prod", "combinations", "unsafe_chunk", "sum_to_size"], dtypes: DT_ALL, note: "combinations: a gather at a compile-time table of index tuples (static length, at most 4M indices)" },
    OpSupport { names: &["tril_indices", "triu_indices"], dtypes: DT_NUMERIC, note: "a compile-time table (at most 2M cells)" },
    OpSupport { names: &["addr", "addbmm"], dtypes: DT_NUMERIC, note: "as matmul/outer product (f16/bf16 in f32); `self` ignored when beta = 0" },
    OpSupport { names: &["kthvalue", "median", "nanmedian", "mode"], dtypes: DT_NUMERIC, note: "static length along `dim`; through the stable sort (NaN largest; median NaN if any, nanmedian skips them); among tied values kthvalue/median may return another index holding the value than torch's quickselect; mode: smallest most-frequent value, its last index (torch's for rows up to 16 elements), from pairwise counts (L² memory), also on bool" },
    OpSupport { names: &["linalg_matrix_exp", "matrix_exp"], dtypes: &["f64"], note: "scaling and squaring: degree-18 Taylor at 1-norm <= 1/2, then up to 64 squarings (a larger norm fails the run); f32/f16/bf16 refused: torch's f32 result misses the exact exponential by more than its tolerance on large norms (2e-3 relative on an OpInfo sample), and kiln does not reproduce its rounding" },
    OpSupport { names: &["gcd", "lcm"], dtypes: DT_INT, note: "Euclid's algorithm with C remainders, unrolled to the dtype's worst case (95 steps for i64)" },
    OpSupport { names: &["quantile", "nanquantile"], dtypes: &["f32", "f64"], note: "torch's quantile_compute: stable sort (NaN last), ranks q·(n - 1) (NaN rows: the last; nanquantile: over the non-NaN count), all five interpolations (linear/midpoint through torch's lerp); static length along `dim`" },
    OpSupport { names: &["searchsorted", "bucketize"], dtypes: DT_NUMERIC, note: "left/right side, sorter, out_int32; a broadcast comparison summed over the sequence (values x sequence work and memory, no binary search); a NaN value lands past the end as in torch" },
    OpSupport { names: &["special_modified_bessel_k0", "special_modified_bessel_k1", "special_scaled_modified_bessel_k0", "special_scaled_modified_bessel_k1"], dtypes: DT_NUMERIC, note: "torch's Cephes series (Clenshaw in x² - 2 below 2 with the log·I0/I1 term, in 8/x - 2 above) in the dtype (f16/bf16 in f32); +inf at 0, NaN below" },
    OpSupport { names: &["special_airy_ai"], dtypes: DT_NUMERIC, note: "torch's Cephes forms: asymptotic with sin/cos below -2.09, rational in 1/ζ from 2.09, 0 above 103.892; between, the power series unrolled to 16 terms, each lane stopping where torch's loop does (at the dtype's epsilon)" },
    OpSupport { names: &["special_ndtri"], dtypes: DT_NUMERIC, note: "torch's Cephes rational functions (central, tails split at z = 8, the upper half through 1 - y), in the dtype; -inf at 0, +inf at 1, NaN outside [0, 1]" },
    OpSupport { names: &["erfinv", "special_erfinv"], dtypes: DT_ALL, note: "torch's CPU algorithm: rational first guess (central for abs(y) <= 0.7, tails beyond) and two Newton steps on erf, in the dtype (f16/bf16 in f32); ±inf at ±1, NaN outside [-1, 1]" },
    OpSupport { names: &["frexp", "ldexp"], dtypes: DT_FLOAT, note: "frexp in f64 (exact); i32 exponents; zero, ±inf and NaN keep their value with exponent 0" },
];

/// Core ATen overloads of torch 2.15 (`torch.Tag.core`).
pub const CORE_ATEN: &[&str] = &[
    "_adaptive_avg_pool2d.default",
    "_adaptive_avg_pool2d_backward.default",
    "_adaptive_avg_pool3d.default",
    "_cdist_forward.default",
    "_embedding_bag.default",
    "_fft_c2r.default",
    "_fft_r2c.default",
    "_local_scalar_dense.default",
    "_log_softmax.default",
    "_native_batch_norm_legit.default",
    "_native_batch_norm_legit.no_stats",
    "_native_batch_norm_legit_no_training.default",
    "_pdist_forward.default",
    "_softmax.default",
    "_to_copy.default",
    "abs.default",
    "acos.default",
    "acosh.default",
    "add.Scalar",
    "add.Tensor",
    "addmm.default",
    "alias.default",
    "amax.default",
    "amin.default",
    "any.default",
    "any.dim",
    "any.dims",
    "arange.start_step",
    "argmax.default",
    "argmin.default",
    "as_strided.default",
    "asin.default",
    "asinh.default",
    "atan.default",
    "atan2.default",
    "atan2.out",
    "atanh.default",
    "avg_pool2d.default",
    "avg_pool2d_backward.default",
    "avg_pool3d.default",
    "bitwise_and.Scalar",
    "bitwise_and.Tensor",
    "bitwise_not.default",
    "bitwise_or.Scalar",
    "bitwise_or.Tensor",
    "bitwise_xor.Scalar",
    "bitwise_xor.Tensor",
    "bmm.default",
    "cat.default",
    "ceil.default",
    "clamp.Tensor",
    "clamp.default",
    "clone.default",
    "col2im.default",
    "constant_pad_nd.default",
    "convolution.default",
    "convolution_backward.default",
    "copy.default",
    "cos.default",
    "cosh.default",
    "cumsum.default",
    "diagonal.default",
    "div.Scalar",
    "div.Scalar_mode",
    "div.Tensor",
    "div.Tensor_mode",
    "elu.default",
    "embedding.default",
    "embedding_dense_backward.default",
    "empty.memory_format",
    "empty_strided.default",
    "eq.Scalar",
    "eq.Tensor",
    "erf.default",
    "exp.default",
    "expand.default",
    "expm1.default",
    "fill.Scalar",
    "flip.default",
    "floor.default",
    "fmod.Scalar",
    "fmod.Tensor",
    "full.default",
    "full_like.default",
    "gather.default",
    "ge.Scalar",
    "ge.Tensor",
    "gelu.default",
    "grid_sampler_2d.default",
    "gt.Scalar",
    "gt.Tensor",
    "hardtanh.default",
    "index.Tensor",
    "index_put.default",
    "index_select.default",
    "isinf.default",
    "isnan.default",
    "le.Scalar",
    "le.Tensor",
    "leaky_relu.default",
    "log.default",
    "log10.default",
    "log1p.default",
    "log2.default",
    "logical_and.default",
    "logical_not.default",
    "logical_or.default",
    "logical_xor.default",
    "lt.Scalar",
    "lt.Tensor",
    "masked_scatter.default",
    "max.dim",
    "max_pool2d_with_indices.default",
    "max_pool2d_with_indices_backward.default",
    "max_pool3d_with_indices.default",
    "maximum.default",
    "mean.default",
    "mean.dim",
    "min.dim",
    "minimum.default",
    "mm.default",
    "mul.Scalar",
    "mul.Tensor",
    "native_dropout.default",
    "native_group_norm.default",
    "native_group_norm_backward.default",
    "native_layer_norm.default",
    "native_layer_norm_backward.default",
    "ne.Scalar",
    "ne.Tensor",
    "neg.default",
    "nonzero.default",
    "permute.default",
    "pow.Scalar",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "prod.default",
    "prod.dim_int",
    "rand.default",
    "randn.default",
    "randperm.default",
    "reciprocal.default",
    "reflection_pad1d.default",
    "reflection_pad2d.default",
    "reflection_pad3d.default",
    "relu.default",
    "remainder.Scalar",
    "remainder.Tensor",
    "repeat.default",
    "replication_pad2d.default",
    "replication_pad3d.default",
    "round.default",
    "rsqrt.default",
    "scalar_tensor.default",
    "scatter.src",
    "scatter.value",
    "scatter_add.default",
    "scatter_reduce.two",
    "select.int",
    "select_scatter.default",
    "sigmoid.default",
    "sign.default",
    "sin.default",
    "sinh.default",
    "slice.Tensor",
    "slice_scatter.default",
    "sort.default",
    "split_with_sizes.default",
    "sqrt.default",
    "squeeze.dim",
    "squeeze.dims",
    "sub.Scalar",
    "sub.Tensor",
    "sum.dim_IntList",
    "sym_numel.default",
    "sym_size.int",
    "sym_storage_offset.default",
    "sym_stride.int",
    "tan.default",
    "tanh.default",
    "topk.default",
    "trunc.default",
    "unsqueeze.default",
    "upsample_bilinear2d.vec",
    "upsample_nearest2d.vec",
    "var.correction",
    "var.dim",
    "view.default",
    "where.self",
];

/// Why a Core ATen overload is not supported (or `None` when it is). Backward
/// ops are excluded by design: kiln compiles inference programs.
pub fn core_aten_status(overload: &str) -> Option<&'static str> {
    let (name, _) = overload.split_once('.').unwrap_or((overload, "default"));
    let handled = SUPPORTED.iter().flat_map(|s| s.names.iter()).any(|n| *n == overload || *n == name);
    if handled {
        return None;
    }
    Some(if name.ends_with("_backward") {
        "excluded: gradients are meaningless for inference"
    } else {
        "not implemented yet"
    })
}

/// Ops PyTorch's OpInfo cases reach that kiln refuses, and why. Each one is
/// a compile-time error naming the op and the Python `file:line` of the call
/// (see `import::error::Problem`); `generate.py --all` / `--summary` counts
/// them.
pub const REFUSED: &[(&str, &str)] = &[
    ("linalg_eig, linalg_eigvals", "not implemented yet: complex results, in LAPACK's order (its Hessenberg QR's deflation order)"),
    ("linalg_lstsq", "torch.export cannot export it (DynamicOutputShapeException: its residuals' size depends on the data); `linalg.pinv(A) @ B` is the minimum-norm solution"),
    ("bincount without an upper bound on its length", "kiln plans memory for the largest length: an int32/int64 input needs `torch._check(out.size(0) <= N)` in the program"),
    ("linalg_matrix_exp, matrix_exp (f32, f16, bf16)", "torch's scaling and squaring in the dtype misses the exact exponential by more than its own tolerance on large norms; kiln computes f64 only"),
    ("segment_reduce with indices or batched (n-d) lengths", "not implemented yet"),
    ("complex32, complex state (a complex buffer written in place), in-place writes that reach a complex value's views, complex64 matrix_exp (complex128 runs), eig/eigvals, linalg.polar, matrix_sqrth, random `*_like` ops with a complex dtype", "not implemented yet: complex values are (real, imaginary) pairs lowered op by op"),
    ("other backward ops (`*_backward`)", "excluded: gradients are meaningless for inference"),
    ("batch_norm, instance_norm, native_batch_norm, _batch_norm_with_update in training mode with running statistics", "they update the running statistics in place, i.e. write into the program's inputs: kiln refuses programs that mutate a user input (write to a copy, return the new value, or keep the statistics as module buffers, which become state)"),
    ("tensor_split by a tensor of indices (and Core ATen's slices at `.item()` bounds)", "the pieces' sizes depend on the data; kiln plans memory for static or symbolically bounded sizes"),
    ("multinomial, rrelu (training), fractional_max_pool2d/3d without random_samples", "draw from torch's generator: kiln's random ops use their own generator, so results could never match torch's"),
    ("linalg_matrix_sqrth, linalg_polar, one_hot without num_classes", "not implemented yet (one_hot's class count would depend on the data)"),
];

/// The table as Markdown: supported ops, then Core ATen coverage.
pub fn render_markdown() -> String {
    let mut s = String::from(
        "# Supported ATen ops\n\nGenerated by `kiln ops --markdown` from `compiler/src/import/support.rs`; \
`BLESS=1 cargo test -p kiln-compiler --test compiler ops_table::` rewrites it.\n\n",
    );
    s.push_str("| ops | dtypes | notes |\n|---|---|---|\n");
    for row in SUPPORTED {
        let dtypes = if row.dtypes.is_empty() { "-".to_string() } else { row.dtypes.join(" ") };
        s.push_str(&format!("| {} | {} | {} |\n", row.names.join(", "), dtypes, row.note));
    }
    let missing: Vec<(&str, &str)> =
        CORE_ATEN.iter().filter_map(|o| core_aten_status(o).map(|why| (*o, why))).collect();
    let covered = CORE_ATEN.len() - missing.len();
    s.push_str(&format!(
        "\n## Core ATen coverage\n\n{covered} of {} Core ATen overloads (torch 2.15) are imported. Whether each one \
matches PyTorch on every sample is measured, not claimed here: `cargo test -p kiln-tests --test e2e conformance:: -- --nocapture` \
prints the overloads that pass every case calling them, and fails below 95 %.\n\n",
        CORE_ATEN.len()
    ));
    s.push_str("| overload | status |\n|---|---|\n");
    for (o, why) in missing {
        s.push_str(&format!("| {o} | {why} |\n"));
    }
    s.push_str(
        "\n## Refused\n\nCompile-time errors naming the op and the Python `file:line` of its call; \
`tests/conformance/generate.py --all` then `--summary` counts the OpInfo cases each one costs.\n\n\
| ops | reason |\n|---|---|\n",
    );
    for (ops, why) in REFUSED {
        s.push_str(&format!("| {ops} | {why} |\n"));
    }
    s.push_str(
        "\n## Beyond ATen\n\n\
| target | status |\n|---|---|\n\
| higher_order.cond | both branches are compiled and **both execute**; `Where` on the predicate selects each output (branches must agree on dtype and shape) |\n\
| higher_order.while_loop | CPU: a loop node with nested condition and body graphs, run by the plan's jumps (trip count decided at run time, no limit); carried values keep dtype and shape; tensors only (no Python-int carries); no data-dependent sizes inside; under `--target pjrt` one `stablehlo.while` when its condition and body lower |\n\
| prims.convert_element_type | a cast to the given dtype (decompositions of `renorm` and others leave it in Core ATen) |\n\
| quantized_decomposed.{quantize,dequantize}_per_tensor (default, .tensor), {quantize,dequantize}_per_channel, choose_qparams.tensor | PT2E's quantize/dequantize as torch's own arithmetic (f32 reciprocal of the f64 scale, round half to even, clamp; `(q - zp) * scale`): bit for bit with eager fake-quant; uint8/int8/int16/int32 |\n\
| torch_nn._linear_cross_entropy_batch_chunked, torch_nn._linear_cross_entropy_batch_chunked_no_reduction | built-in lowerings (`kiln ops --custom`) of the op `F.linear_cross_entropy(.., options=..)` calls (a library custom op torch.export keeps): `cross_entropy(linear(input, w, b), target, ..)` in one piece, the logits in the input's dtype, softmax and reduction in f32 (f64 for f64); class indices or probabilities, class weights, ignore_index; its gradient outputs only when autograd did not ask for them (empty) |\n\
| export.access_subclass_inner_tensor, pickled weights (raw torchao archives) | compile-time error asking to save after `ep.run_decompositions()` |\n\
| custom ops (`mylib::op`, registered with `torch.library`) | compile-time error with the call's signature and Python line, unless a lowering is registered in Rust with `ImportOptions::with_custom_op` |\n",
    );
    s
}
