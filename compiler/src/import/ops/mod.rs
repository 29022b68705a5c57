//! Per-op conversion. [`convert`] dispatches on the ATen op name; each handler
//! reads its arguments *by name* with the ATen schema's defaults, because torch
//! omits arguments left at their default. The schema line sits above each
//! handler so the defaults can be checked against it.

mod activation;
mod airy;
mod batch_norm;
mod bessel_k;
mod complex_composite;
mod complex_factor;
mod complex_linalg;
mod complex_math;
mod complex_ops;
pub(crate) mod composite;
mod conv_transpose_slow;
mod data_dependent;
mod einsum;
mod elementwise;
mod embedding_bag;
mod export_ir;
pub(crate) mod fft;
mod geometry;
mod histogram;
mod index_dim;
mod indexing;
pub(crate) mod linalg;
mod margin;
mod ndtri;
mod nn;
mod number;
mod patches;
mod quant;
mod quantile;
mod random;
mod resize;
mod segment_reduce;
mod selection;
mod shape;
mod spatial;
mod stats;
mod training_ir;

pub(crate) use indexing::{diagonal_scatter_value, diagonal_value, select_scatter_value, slice_scatter_value};
pub(crate) use shape::slice_value;

use super::importer::{unsupported, Importer, R};
use super::views::ViewStep;
use crate::pt2::program::{Arg, Node};
use kiln_ir::{Dim, ScanKind};

/// Converts one node, binding its outputs.
pub(crate) fn convert(imp: &mut Importer, node: &Node) -> R<()> {
    let target = node.target.as_str();
    if let Some(op) = target.strip_prefix("_operator.") {
        return sym_operator(imp, node, op);
    }
    let Some(aten) = target.strip_prefix("torch.ops.aten.") else {
        return non_aten(imp, node, target);
    };
    let (name, overload) = aten.rsplit_once('.').unwrap_or((aten, "default"));
    // In-place variants (`add_`, `relu_`) are functionalised: same math, and
    // the mutated tensor's name is rebound to the result.
    let inplace = name.ends_with('_') && !name.starts_with("__") && name.len() > 1;
    let name = if inplace { &name[..name.len() - 1] } else { name };
    // Complex values live in the importer's side table, not in the IR: every
    // node that reads or makes one is lowered onto their parts.
    if fft::involves_complex(imp, node) {
        // `detach_` changes nothing; `resize_`/`resize_as_` rebind the name
        // as on real values, and so does a write no other view or state
        // sees (`x.clone().mul_(y)`). Writes that would have to reach a
        // complex value's views are refused.
        if inplace && !matches!(name, "detach" | "resize" | "resize_as") {
            let mutated = imp.tensor_name(node, "self")?;
            if !imp.write_is_private(mutated) {
                return unsupported(format!(
                    "in-place `{name}_` on a complex value that other views or the program's state see; {}",
                    super::importer::COMPLEX_SCOPE
                ));
            }
        }
        fft::convert(imp, node, name, overload)?;
        if inplace && name != "detach" {
            let mutated = imp.tensor_name(node, "self")?.to_string();
            if let Some(Arg::Tensor(out)) = node.outputs.first() {
                if let Some((re, im)) = imp.complex(out) {
                    imp.bind_complex(&mutated, re, im);
                }
                // The result is one more alias of the storage: a later
                // write through it is not private.
                imp.record_view(out, &mutated, ViewStep::Identity);
            }
        }
        return Ok(());
    }
    // `resize_`/`resize_as_` change their operand's shape: the name is
    // rebound to the reshaped value (its old views are not rewritten).
    if inplace && matches!(name, "resize" | "resize_as") {
        let mutated = imp.tensor_name(node, "self")?.to_string();
        dispatch(imp, node, name, overload)?;
        if let Some(Arg::Tensor(out)) = node.outputs.first() {
            let v = imp.value(out)?;
            imp.bind_name(&mutated, v);
        }
        return Ok(());
    }
    if inplace {
        let mutated = imp.tensor_name(node, "self")?.to_string();
        dispatch(imp, node, name, overload)?;
        let (out, result) = match node.outputs.first() {
            Some(Arg::Tensor(out)) => (out, imp.value(out)?),
            _ => return super::importer::invalid("in-place op without a tensor output"),
        };
        // The write keeps `self`'s type: views of it are rebuilt with their axes.
        let (before, after) = (imp.ty(imp.value(&mutated)?), imp.ty(result));
        let same = before.dtype == after.dtype
            && before.rank() == after.rank()
            && before
                .shape
                .iter()
                .zip(&after.shape)
                .all(|(a, b)| kiln_ir::infer::dims_equal(a, b, &imp.g.symbols) != Some(false));
        if !same {
            return super::importer::invalid(format!(
                "in-place `{name}_` gives {} {:?}, but `{mutated}` is {} {:?}",
                after.dtype, after.shape, before.dtype, before.shape
            ));
        }
        // Through views of `mutated` back to its storage, and on to its other
        // views (see `import/views.rs`).
        imp.write_inplace(&mutated, result)?;
        // `add_` returns `self`: its output is one more alias of the storage.
        imp.record_view(out, &mutated, ViewStep::Identity);
        return Ok(());
    }
    dispatch(imp, node, name, overload)
}

fn non_aten(imp: &mut Importer, node: &Node, target: &str) -> R<()> {
    if let Some(hop) = target.strip_prefix("torch.ops.higher_order.") {
        return unsupported(format!(
            "higher-order op `{hop}` is not supported (kiln imports `cond`; other control flow and wrappers are not)"
        ));
    }
    match target.strip_prefix("torch.ops.").and_then(|t| t.split_once('.')) {
        // PT2E's quantize/dequantize ops: torch's own arithmetic.
        Some(("quantized_decomposed", rest)) => {
            let (name, overload) = rest.rsplit_once('.').unwrap_or((rest, "default"));
            quant::convert(imp, node, name, overload)
        }
        // `prims.convert_element_type(a, dtype)`: a cast (left by some decompositions).
        Some(("prims", rest)) if rest.starts_with("convert_element_type.") => {
            let a = imp.tensor(node, "a")?;
            let out = imp.out_ty(node, 0)?;
            let v = imp.cast(a, out.dtype);
            imp.bind(node, 0, v)
        }
        // A raw torchao program reads its subclass weights' inner tensors.
        Some(("export", rest)) if rest.starts_with("access_subclass_inner_tensor") => unsupported(
            "tensor subclass weights (torchao) are read through `export::access_subclass_inner_tensor`; \
             save the program after `ep.run_decompositions()`, which turns them into plain tensors",
        ),
        // Custom ops (and prims): a registered lowering, or a report of
        // what the call shows.
        Some((ns, rest)) => super::custom::convert(imp, node, ns, rest),
        None => Err(super::importer::Fail::Unsupported(None)),
    }
}

fn dispatch(imp: &mut Importer, n: &Node, name: &str, overload: &str) -> R<()> {
    use elementwise as e;
    use kiln_ir::{PadMode, PoolKind};
    use shape as s;
    match name {
        // `torch._assert_async(cond, msg)`: a run-time check, as in eager.
        "_assert_async" | "_functional_assert_async" => assert_async(imp, n, name),
        // Symbolic-shape assertions and metadata checks: the shapes they
        // constrain are checked where kiln binds them (declared bounds).
        "_assert_scalar"
        | "_assert_tensor_metadata"
        | "sym_constrain_range"
        | "sym_constrain_range_for_size"
        | "_functional_sym_constrain_range"
        | "_functional_sym_constrain_range_for_size"
        | "_assert_tensor_metadata_functional" => Ok(()),
        "sym_size" => sym_size(imp, n),
        "sym_numel" => sym_numel(imp, n),
        "sym_stride" => sym_stride(imp, n),
        "sym_storage_offset" => sym_storage_offset(imp, n),

        "linear" => nn::linear(imp, n),
        "addmm" => nn::addmm(imp, n),
        "mm" | "bmm" | "matmul" => nn::matmul(imp, n),
        "_int_mm" => quant::int_mm(imp, n),
        "einsum" => einsum::einsum(imp, n),
        "convolution" | "_convolution" => nn::convolution(imp, n),
        "conv1d" | "conv2d" | "conv3d" => nn::conv_nd(imp, n, overload),
        "batch_norm" => batch_norm::batch_norm(imp, n),
        "_native_batch_norm_legit_no_training" => batch_norm::native_batch_norm_no_training(imp, n),
        "_native_batch_norm_legit" | "_native_batch_norm_legit_functional" => {
            batch_norm::native_batch_norm_legit(imp, n, name, overload)
        }
        "layer_norm" => nn::layer_norm(imp, n),
        "native_layer_norm" => nn::native_layer_norm(imp, n),
        "softmax" | "_softmax" => e::softmax(imp, n, false),
        "log_softmax" | "_log_softmax" => e::softmax(imp, n, true),
        "max_pool2d" | "max_pool2d_with_indices" => nn::max_pool2d(imp, n),
        "avg_pool2d" => nn::avg_pool2d(imp, n),
        "adaptive_avg_pool2d" | "_adaptive_avg_pool2d" => nn::adaptive_avg_pool(imp, n),
        "scaled_dot_product_attention" => nn::attention(imp, n),

        "relu" | "gelu" | "silu" | "sigmoid" | "tanh" | "exp" | "log" | "sqrt" | "rsqrt" | "neg" | "abs" | "erf"
        | "sin" | "cos" | "reciprocal" | "floor" | "ceil" | "round" | "sign" | "logical_not" | "log1p" | "expm1"
        | "trunc" | "fix" | "tan" | "asin" | "acos" | "atan" | "sinh" | "cosh" | "asinh" | "acosh" | "atanh"
        | "log2" | "log10" | "bitwise_not" | "arcsin" | "arccos" | "arctan" | "arcsinh" | "arccosh" | "arctanh"
        | "negative" | "absolute" | "erfc" => e::unary(imp, n, name),
        "lgamma"
        | "digamma"
        | "special_digamma"
        | "special_psi"
        | "i0"
        | "special_i0"
        | "special_i0e"
        | "special_i1"
        | "special_i1e"
        | "special_erfcx"
        | "special_ndtr"
        | "special_log_ndtr"
        | "special_bessel_j0"
        | "special_bessel_j1"
        | "special_bessel_y0"
        | "special_bessel_y1"
        | "special_entr"
        | "special_spherical_bessel_j0"
        | "special_modified_bessel_i0"
        | "special_modified_bessel_i1" => e::unary(imp, n, name),
        "clamp" | "clamp_min" | "clamp_max" if overload == "Tensor" => activation::clamp_tensor(imp, n),
        "hardtanh" | "relu6" | "clamp" | "clamp_min" | "clamp_max" => e::clamp(imp, n, name),
        "hardswish" | "hardsigmoid" | "mish" | "softplus" | "leaky_relu" | "elu" | "square" => {
            activation::activation(imp, n, name)
        }
        "isnan" | "isinf" => activation::float_class(imp, n, name),
        "atan2" | "arctan2" | "fmod" => e::binary(imp, n, name, overload),
        "special_chebyshev_polynomial_t"
        | "special_chebyshev_polynomial_u"
        | "special_chebyshev_polynomial_v"
        | "special_chebyshev_polynomial_w"
        | "special_shifted_chebyshev_polynomial_t"
        | "special_shifted_chebyshev_polynomial_u"
        | "special_shifted_chebyshev_polynomial_v"
        | "special_shifted_chebyshev_polynomial_w"
        | "special_hermite_polynomial_h"
        | "special_hermite_polynomial_he"
        | "special_laguerre_polynomial_l"
        | "special_legendre_polynomial_p" => e::binary(imp, n, name, overload),
        "special_zeta" | "igamma" | "igammac" | "special_gammainc" | "special_gammaincc" | "nextafter" => {
            e::binary(imp, n, name, overload)
        }
        "polygamma" | "special_polygamma" => e::polygamma(imp, n),
        "cumsum" => stats::cumsum(imp, n),
        "linalg_inv" => linalg::inv(imp, n, false),
        "linalg_inv_ex" => linalg::inv(imp, n, true),
        "linalg_det" | "_linalg_det" => linalg::det(imp, n),
        "linalg_slogdet" | "_linalg_slogdet" => linalg::slogdet(imp, n),
        "logdet" => linalg::logdet(imp, n),
        "linalg_lu_factor" => linalg::lu_factor(imp, n, false),
        "linalg_lu_factor_ex" => linalg::lu_factor(imp, n, true),
        "linalg_ldl_factor" => linalg::ldl_factor(imp, n, false),
        "linalg_ldl_factor_ex" => linalg::ldl_factor(imp, n, true),
        "linalg_ldl_solve" => linalg::ldl_solve(imp, n),
        "linalg_solve" => linalg::solve(imp, n, linalg::SolveResults::Solution),
        "linalg_solve_ex" => linalg::solve(imp, n, linalg::SolveResults::Info),
        "_linalg_solve_ex" => linalg::solve(imp, n, linalg::SolveResults::LuAndInfo),
        "linalg_cholesky" => linalg::cholesky(imp, n, false),
        "linalg_cholesky_ex" => linalg::cholesky(imp, n, true),
        "linalg_solve_triangular" => linalg::solve_triangular(imp, n),
        "cholesky_solve" => linalg::cholesky_solve(imp, n),
        "linalg_qr" => linalg::qr(imp, n),
        "_linalg_eigh" | "linalg_eigh" | "linalg_eigvalsh" => linalg::eigh(imp, n),
        "_linalg_svd" => linalg::svd(imp, n, linalg::SvdApi::Core),
        "linalg_svd" => linalg::svd(imp, n, linalg::SvdApi::Linalg),
        "svd" => linalg::svd(imp, n, linalg::SvdApi::Torch),
        "linalg_svdvals" => linalg::svd(imp, n, linalg::SvdApi::Vals),
        "linalg_pinv" | "pinverse" => linalg::pinv(imp, n, overload),
        "linalg_matrix_norm" => linalg::matrix_norm(imp, n),
        "linalg_norm" => linalg::norm(imp, n),
        "nuclear_norm" => linalg::nuclear_norm(imp, n),
        "linalg_cond" => linalg::cond(imp, n),
        "linalg_matrix_power" => linalg::matrix_power(imp, n),
        "triangular_solve" => linalg::triangular_solve_legacy(imp, n),
        "cholesky_inverse" => linalg::cholesky_inverse(imp, n),
        "linalg_tensorinv" => linalg::tensorinv(imp, n),
        "linalg_tensorsolve" => linalg::tensorsolve(imp, n),
        // A real input's Hermitian FFT (a complex one is routed there already).
        "fft_hfft" | "fft_hfft2" | "fft_hfftn" => fft::convert(imp, n, name, overload),
        "linalg_lu" => linalg::lu(imp, n),
        "lu_unpack" => linalg::lu_unpack(imp, n),
        "linalg_lu_solve" => linalg::lu_solve(imp, n, false),
        "lu_solve" => linalg::lu_solve(imp, n, true),
        "_lu_with_info" => linalg::lu_with_info(imp, n),
        "geqrf" => linalg::geqrf(imp, n),
        "linalg_householder_product" | "orgqr" => linalg::householder_product(imp, n),
        "ormqr" => linalg::ormqr(imp, n),
        "linalg_matrix_rank" => linalg::matrix_rank(imp, n, overload),
        "cumprod" => stats::scan(imp, n, ScanKind::Prod),
        "logcumsumexp" => stats::scan(imp, n, ScanKind::LogSumExp),
        "cummax" => stats::cum_extreme(imp, n, true),
        "cummin" => stats::cum_extreme(imp, n, false),
        "diff" => stats::diff(imp, n),
        "argmin" => stats::argmin(imp, n),
        "sort" => stats::sort(imp, n),
        "topk" => stats::topk(imp, n),
        "var" | "std" => stats::var_std(imp, n, name, overload),
        "tril" => spatial::tri(imp, n, false),
        "triu" => spatial::tri(imp, n, true),
        "flip" => spatial::flip(imp, n),
        "constant_pad_nd" => spatial::constant_pad_nd(imp, n),
        "pad" => spatial::pad(imp, n),
        "reflection_pad1d" | "reflection_pad2d" | "reflection_pad3d" => spatial::mode_pad(imp, n, PadMode::Reflect),
        "replication_pad1d" | "replication_pad2d" | "replication_pad3d" => {
            spatial::mode_pad(imp, n, PadMode::Replicate)
        }
        "upsample_nearest1d"
        | "upsample_nearest2d"
        | "upsample_nearest3d"
        | "upsample_linear1d"
        | "upsample_bilinear2d"
        | "upsample_trilinear3d" => spatial::upsample(imp, n, name),
        "_upsample_nearest_exact1d" | "_upsample_nearest_exact2d" | "_upsample_nearest_exact3d" => {
            resize::nearest_exact(imp, n, name)
        }
        "upsample_bicubic2d" => resize::bicubic(imp, n, name),
        "adaptive_avg_pool1d" => nn::adaptive_avg_pool1d(imp, n),
        "pixel_shuffle" => patches::pixel_shuffle(imp, n),
        "pixel_unshuffle" => patches::pixel_unshuffle(imp, n),
        "im2col" => patches::im2col(imp, n),
        "unfold" => patches::unfold(imp, n),
        // Complex-valued ops. `convert` sends every node with a complex
        // operand or result to `fft.rs` first, so these arms see only real
        // tensors: conjugation and `real` are then the identity.
        "_fft_r2c" | "_fft_c2r" | "_fft_c2c" | "fft_rfft" | "fft_irfft" | "fft_fft" | "fft_ifft" | "fft_rfft2"
        | "fft_irfft2" | "fft_fft2" | "fft_ifft2" | "fft_rfftn" | "fft_irfftn" | "fft_fftn" | "fft_ifftn" | "stft"
        | "istft" | "fft_ihfft" | "fft_ihfft2" | "fft_ihfftn" | "polar" | "view_as_real" | "view_as_complex"
        | "complex" | "imag" | "angle" => fft::convert(imp, n, name, overload),
        "real" | "conj" | "_conj" | "resolve_conj" | "resolve_neg" => s::identity_or_cast(imp, n, "alias"),
        "conj_physical" | "_conj_physical" => s::identity_or_cast(imp, n, "clone"),
        "hann_window" => fft::hann_window(imp, n),
        "take_along_dim" => index_dim::take_along_dim(imp, n),
        "index_add" => index_dim::index_add(imp, n),
        "index_reduce" => index_dim::index_reduce(imp, n),
        "index_copy" => index_dim::index_copy(imp, n),
        "index_fill" => index_dim::index_fill(imp, n),
        "masked_select" => data_dependent::masked_select(imp, n),
        "group_norm" => nn::group_norm(imp, n, false),
        "native_group_norm" => nn::group_norm(imp, n, true),
        "rms_norm" => nn::rms_norm(imp, n),
        "conv_transpose1d" | "conv_transpose2d" | "conv_transpose3d" => nn::conv_transpose(imp, n),
        "avg_pool1d" => nn::pool1d(imp, n, PoolKind::Avg),
        "max_pool1d" | "max_pool1d_with_indices" => nn::pool1d(imp, n, PoolKind::Max),
        "add"
        | "sub"
        | "rsub"
        | "mul"
        | "div"
        | "remainder"
        | "floor_divide"
        | "pow"
        | "maximum"
        | "minimum"
        | "eq"
        | "ne"
        | "lt"
        | "le"
        | "gt"
        | "ge"
        | "logical_and"
        | "logical_or"
        | "logical_xor"
        | "bitwise_and"
        | "bitwise_or"
        | "bitwise_xor"
        | "bitwise_left_shift"
        | "bitwise_right_shift"
        | "__lshift__"
        | "__rshift__" => e::binary(imp, n, name, overload),
        // Python's `&`, `|`, `^` on tensors: training IR keeps the dunder names.
        "__and__" | "__or__" | "__xor__" => e::binary(imp, n, &format!("bitwise_{}", name.trim_matches('_')), overload),
        "where" if overload == "self" => e::where_(imp, n),
        "where" if overload == "ScalarSelf" => e::where_(imp, n),
        "where" if overload == "ScalarOther" => e::where_(imp, n),
        "where" if overload == "Scalar" => e::where_(imp, n),
        "masked_fill" => e::masked_fill(imp, n),
        "mean" | "sum" | "amax" | "amin" | "prod" | "any" => e::reduce(imp, n, name, overload),
        "max" | "min" if overload == "dim" => stats::min_max_dim(imp, n, name),
        // `x.max()`: the whole tensor's maximum, 0-d.
        "max" | "min" if overload == "default" => {
            e::reduce(imp, n, if name == "max" { "amax" } else { "amin" }, overload)
        }
        "argmax" => e::argmax(imp, n),

        "view" | "_unsafe_view" | "reshape" | "flatten" | "unflatten" | "unsqueeze" | "squeeze" | "view_as"
        | "reshape_as" => s::reshape(imp, n, name),
        "expand" | "expand_as" => s::expand(imp, n),
        "t" | "transpose" | "permute" | "numpy_T" | "mT" | "swapaxes" | "swapdims" => s::permute(imp, n, name),
        "movedim" | "moveaxis" if overload == "int" => s::permute(imp, n, "movedim"),
        "alias" | "clone" | "contiguous" | "detach" | "lift_fresh_copy" | "_to_copy" | "to" | "type_as" => {
            s::identity_or_cast(imp, n, name)
        }
        "dropout" | "feature_dropout" | "alpha_dropout" => random::dropout(imp, n, name),
        "slice" => s::slice(imp, n),
        "select" => s::select(imp, n),
        "narrow" => s::narrow(imp, n),
        "cat" | "concat" | "concatenate" => s::cat(imp, n),
        "split" | "split_with_sizes" | "chunk" | "unbind" | "tensor_split" => s::split(imp, n, name),
        "embedding" => s::embedding(imp, n),
        "index_select" => s::index_select(imp, n),
        "index" | "_unsafe_index" if overload == "Tensor" => indexing::index(imp, n),
        "gather" => indexing::gather(imp, n),
        "scatter" | "scatter_add" | "scatter_reduce" => indexing::scatter(imp, n, name, overload),
        "index_put" | "_unsafe_index_put" => indexing::index_put(imp, n),
        "select_scatter" => indexing::select_scatter(imp, n),
        "slice_scatter" => indexing::slice_scatter(imp, n),
        "diagonal_scatter" => indexing::diagonal_scatter(imp, n),
        "diagonal" => indexing::diagonal(imp, n),
        "as_strided" => indexing::as_strided(imp, n),
        "masked_scatter" => indexing::masked_scatter(imp, n),
        "embedding_bag" | "_embedding_bag" | "_embedding_bag_forward_only" => {
            embedding_bag::embedding_bag(imp, n, name)
        }
        "embedding_renorm" => embedding_bag::embedding_renorm(imp, n),
        "col2im" => indexing::col2im(imp, n),
        "avg_pool3d" => nn::pool3d(imp, n, PoolKind::Avg),
        "max_pool3d" | "max_pool3d_with_indices" => nn::pool3d(imp, n, PoolKind::Max),
        "adaptive_avg_pool3d" | "_adaptive_avg_pool3d" => nn::adaptive_avg_pool3d(imp, n),
        "arange" => s::arange(imp, n),
        "full" | "zeros" | "ones" | "empty" | "full_like" | "zeros_like" | "ones_like" | "empty_like" | "new_zeros"
        | "new_ones" | "new_full" | "new_empty" | "scalar_tensor" | "empty_strided" => s::full(imp, n, name),
        "repeat" => s::repeat(imp, n),
        "copy" => s::copy(imp, n),
        "fill" => s::fill(imp, n),
        "native_dropout" => random::native_dropout(imp, n),
        "rand" | "rand_like" | "randn" | "randn_like" | "uniform" | "normal" | "normal_functional" => {
            random::continuous(imp, n, name, overload)
        }
        "randint" | "randint_like" => random::randint(imp, n),
        "randperm" => random::randperm(imp, n),
        "_cdist_forward" | "cdist" => geometry::cdist(imp, n),
        "_pdist_forward" | "pdist" => geometry::pdist(imp, n),
        "grid_sampler_2d" => geometry::grid_sampler_2d(imp, n),
        "grid_sampler" => geometry::grid_sampler(imp, n),
        "grid_sampler_3d" => geometry::grid_sampler_3d(imp, n),
        "histogram" => histogram::histogram(imp, n, overload),
        "histogramdd" | "_histogramdd_bin_edges" | "_histogramdd_from_bin_cts" | "_histogramdd_from_bin_tensors" => {
            histogram::histogramdd(imp, n, name, overload)
        }
        "bernoulli" => random::bernoulli(imp, n, overload),
        "nonzero" | "argwhere" => data_dependent::nonzero(imp, n),
        "nonzero_static" => data_dependent::nonzero_static(imp, n),
        "_unique2" => data_dependent::unique(imp, n, false),
        "unique_consecutive" => data_dependent::unique(imp, n, true),
        "unique_dim" => data_dependent::unique_dim(imp, n),
        "bincount" => data_dependent::bincount(imp, n),
        "quantile" => quantile::quantile(imp, n, false),
        "special_ndtri" => ndtri::ndtri(imp, n),
        "segment_reduce" => segment_reduce::segment_reduce(imp, n),
        "special_airy_ai" => airy::airy_ai(imp, n),
        "special_modified_bessel_k0" => bessel_k::bessel_k(imp, n, 0, false),
        "special_modified_bessel_k1" => bessel_k::bessel_k(imp, n, 1, false),
        "special_scaled_modified_bessel_k0" => bessel_k::bessel_k(imp, n, 0, true),
        "special_scaled_modified_bessel_k1" => bessel_k::bessel_k(imp, n, 1, true),
        "nanquantile" => quantile::quantile(imp, n, true),
        "nonzero_numpy" => data_dependent::nonzero_numpy(imp, n),
        "_local_scalar_dense" | "item" => data_dependent::local_scalar_dense(imp, n),
        "multi_margin_loss" | "multilabel_margin_loss" | "multilabel_margin_loss_forward" => {
            margin::dispatch(imp, n, name)
        }
        _ => match composite::dispatch(imp, n, name, overload) {
            Err(super::importer::Fail::Unsupported(None)) => export_ir::dispatch(imp, n, name, overload),
            other => other,
        },
    }
}

/// `aten::sym_size.int(Tensor self, int dim) -> SymInt`
fn sym_size(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let dim = imp.int(n, "dim", None)?;
    let rank = imp.ty(x).rank();
    let axis = shape::normalize_axis(dim, rank)?;
    let d = imp.ty(x).shape[axis].clone();
    bind_sym_output(imp, n, d)
}

/// `aten::sym_numel(Tensor self) -> SymInt`
fn sym_numel(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let d = imp.ty(x).numel();
    bind_sym_output(imp, n, d)
}

/// `aten::sym_stride.int(Tensor self, int dim) -> SymInt`: every tensor kiln
/// holds is contiguous, so the product of the later dims.
fn sym_stride(imp: &mut Importer, n: &Node) -> R<()> {
    let x = imp.tensor(n, "self")?;
    let rank = imp.ty(x).rank();
    let axis = shape::normalize_axis(imp.int(n, "dim", None)?, rank.max(1))?;
    let d = imp.ty(x).shape.iter().skip(axis + 1).fold(Dim::Const(1), |acc, d| Dim::mul(acc, d.clone()));
    bind_sym_output(imp, n, d)
}

/// `aten::sym_storage_offset(Tensor self) -> SymInt`: always 0 (see `sym_stride`).
fn sym_storage_offset(imp: &mut Importer, n: &Node) -> R<()> {
    bind_sym_output(imp, n, Dim::Const(0))
}

/// `_assert_async(self[, assert_msg])`: the run fails with the message
/// unless the one-element `self` is nonzero (eager raises the same way on
/// the CPU). `_functional_assert_async` also threads an effect token through,
/// which kiln passes on unchanged (effects run in schedule order).
fn assert_async(imp: &mut Importer, n: &Node, name: &str) -> R<()> {
    let cond = imp.tensor(n, "self")?;
    let ty = imp.ty(cond);
    if ty.shape.iter().any(|d| !matches!(d, Dim::Const(1))) {
        return unsupported(format!("{name} on a tensor of shape {:?}: it takes a one-element condition", ty.shape));
    }
    let message = imp.string(n, "assert_msg", "Expected Tensor with single nonzero value, but got zero")?.to_string();
    let loc = imp.loc();
    imp.g.add_node(kiln_ir::Op::Assert { message }, vec![cond], Vec::new(), loc);
    if name == "_functional_assert_async" {
        let token = imp.tensor(n, "dep_token")?;
        return imp.bind(n, 0, token);
    }
    Ok(())
}

fn bind_sym_output(imp: &mut Importer, n: &Node, d: Dim) -> R<()> {
    match n.outputs.first() {
        Some(Arg::SymInt(crate::pt2::program::SymIntArg::Name(name))) => {
            imp.bind_sym(name, d);
            Ok(())
        }
        other => super::importer::invalid(format!("expected a symbolic int output, found {other:?}")),
    }
}

/// `_operator.add/sub/mul/floordiv/mod/neg` on symbolic ints (shape
/// arithmetic); comparisons only feed assertions, which are dropped.
fn sym_operator(imp: &mut Importer, n: &Node, op: &str) -> R<()> {
    let outputs_bool = n.outputs.iter().all(|o| matches!(o, Arg::SymBool(_)));
    if outputs_bool && matches!(op, "eq" | "ne" | "lt" | "le" | "gt" | "ge" | "and_" | "or_" | "not_") {
        return Ok(());
    }
    let mut operand = |i: usize| -> R<Dim> {
        match n.inputs.get(i).map(|a| &a.arg) {
            Some(Arg::Int(v)) => Ok(Dim::Const(*v)),
            Some(Arg::SymInt(s)) => imp.sym(s),
            other => super::importer::invalid(format!("operand {i}: expected a (symbolic) int, found {other:?}")),
        }
    };
    let d = match op {
        "neg" => Dim::mul(Dim::Const(-1), operand(0)?),
        "add" | "sub" | "mul" | "floordiv" | "mod" => {
            let (a, b) = (operand(0)?, operand(1)?);
            match op {
                "add" => Dim::add(a, b),
                "sub" => Dim::add(a, Dim::mul(Dim::Const(-1), b)),
                "mul" => Dim::mul(a, b),
                "floordiv" => Dim::floor_div(a, b),
                _ => Dim::modulo(a, b),
            }
        }
        _ => return Err(super::importer::Fail::Unsupported(None)),
    };
    bind_sym_output(imp, n, d)
}
