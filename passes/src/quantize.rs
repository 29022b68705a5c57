//! `kiln compile --quantize`: the f32 weights of a float program's linear
//! layers quantized by kiln, each layer becoming an `Op::QuantLinear`.
//!
//! Run once before the pipeline (it takes its own [`QuantizeConfig`], so it
//! is not one of the pipeline's passes); layers are found as the importer
//! writes them after [`crate::simplify`] (the compiler runs it first):
//! `linear(x, w [, b])` (training IR) and `matmul(x, permute(w, [1, 0]))`
//! followed by `add(·, b)` (Core ATen's `addmm`, and its `bmm` by an
//! expanded weight, which simplify makes a matmul by the matrix), `w` an
//! f32 constant `[N, K]`.
//!
//! Rounding is torch's: `q = clamp(rint(w · (1 / s)) + zp, qmin, qmax)`,
//! the reciprocal in f32, half to even. Schemes:
//! - int8 (weight-only, dynamic and static): per output channel, symmetric,
//!   torchao's rule `s = max|w_row| / 127.5` over `[-128, 127]` — the same
//!   integers torchao's `Int8WeightOnlyConfig` stores; static activations
//!   get one scale and zero point per layer input from the observer over
//!   the calibration samples' values ([`crate::observe`]), which the
//!   compiler collects by running the float program;
//! - int4: per group of `group` input features, `[-8, 7]`, symmetric (`s =
//!   m / 7.5`, `m` = max |w|) or asymmetric (`s = (max − min) / 15` over the
//!   range widened to hold 0, `zp = clamp(−8 − rint(min / s))`), the range
//!   shrunk by the clipping ratio in `{1, 0.99, .., 0.60}` whose dequantized
//!   group has the least squared error, each candidate's scale also refitted
//!   by least squares to its integers (MSE clipping; `clip=none` keeps the
//!   full range, torchao's `IntxWeightOnlyConfig` rule).
//!
//! With calibration samples (`--calibration`): int4 scales its weight
//! columns by the activations' magnitudes (AWQ-style, [`activation_aware`])
//! and then quantizes with GPTQ's error feedback over the calibration rows
//! where that lowers the layer's output error on them ([`gptq`]);
//! int8-dynamic smooths the activations' outlier channels into the weight
//! (SmoothQuant-style, [`smooth_dynamic`]). Both divide the layer input by
//! the column scales at run time (a `mul` before the layer).

use crate::observe::{ActObservation, Observer};
use crate::quant_linear::{absorb_columns, Acts, QuantWeight};
use crate::rewrite::{rewrite_in_order, Rewrite};
use crate::PassError;
use kiln_ir::{BinaryOp, ConstBytes, DType, Graph, NodeId, Op, TensorType, ValueId};

/// A layer's quantized weight, its activations, and the per-input-channel
/// scaling its input gets first (activation-aware int4).
type Chosen = (QuantWeight, Acts, Option<Vec<f32>>);

/// How the weights are quantized.
#[derive(Clone, Debug, PartialEq)]
pub enum QuantScheme {
    /// Per-channel symmetric int8 weights, f32 activations.
    Int8Weight,
    /// Per-channel symmetric int8 weights, per-row dynamic int8
    /// activations: with a zero point per row from its range (`asymmetric`,
    /// the default), or torchao's per-token symmetric rule (`:sym`).
    Int8Dynamic { asymmetric: bool },
    /// Per-channel symmetric int8 weights, per-tensor int8 activations with
    /// parameters from calibration ([`QuantizeConfig::activations`]).
    Int8Static { observer: Observer },
    /// Group-wise int4 weights (two a byte), f32 activations.
    Int4Weight { group: usize, asymmetric: bool, clip_search: bool },
}

impl QuantScheme {
    /// `int8-weight`, `int8-dynamic[:sym|:asym]`, `int8-static[:observer=minmax|percentile[=P]|mse]`,
    /// `int4-weight[:group=32|64|128][:asym][:clip=none]`.
    pub fn parse(mode: &str) -> Result<QuantScheme, String> {
        let mut parts = mode.split(':');
        let base = parts.next().unwrap_or_default();
        let options: Vec<&str> = parts.collect();
        let scheme = match base {
            "int8-weight" => QuantScheme::Int8Weight,
            "int8-dynamic" => {
                let mut asymmetric = true;
                for o in &options {
                    match *o {
                        "asym" => asymmetric = true,
                        "sym" => asymmetric = false,
                        _ => return Err(format!("unknown int8-dynamic option `{o}` (sym, asym)")),
                    }
                }
                return Ok(QuantScheme::Int8Dynamic { asymmetric });
            }
            "int8-static" => {
                let mut observer = Observer::MinMax;
                for o in &options {
                    match o.strip_prefix("observer=") {
                        Some(name) => observer = Observer::parse(name)?,
                        None => return Err(format!("unknown int8-static option `{o}` (observer=NAME)")),
                    }
                }
                return Ok(QuantScheme::Int8Static { observer });
            }
            "int4-weight" => {
                let (mut group, mut asymmetric, mut clip_search) = (32, false, true);
                for o in &options {
                    match *o {
                        "asym" => asymmetric = true,
                        "sym" => asymmetric = false,
                        "clip=none" => clip_search = false,
                        "clip=mse" => clip_search = true,
                        _ => match o.strip_prefix("group=").map(str::parse::<usize>) {
                            Some(Ok(g)) if g >= 2 && g % 2 == 0 => group = g,
                            _ => return Err(format!("unknown int4-weight option `{o}` (group=N, asym, clip=none)")),
                        },
                    }
                }
                return Ok(QuantScheme::Int4Weight { group, asymmetric, clip_search });
            }
            other => {
                return Err(format!(
                    "unknown quantization mode `{other}` (known: int8-weight, int8-dynamic[:sym|:asym], \
                     int8-static[:observer=..], int4-weight[:group=32|64|128][:asym])"
                ))
            }
        };
        match options.first() {
            Some(o) => Err(format!("`{base}` takes no options, found `{o}`")),
            None => Ok(scheme),
        }
    }
}

impl std::fmt::Display for QuantScheme {
    /// The mode as `--quantize` spells it ([`QuantScheme::parse`] reads it back).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuantScheme::Int8Weight => write!(f, "int8-weight"),
            QuantScheme::Int8Dynamic { asymmetric: true } => write!(f, "int8-dynamic"),
            QuantScheme::Int8Dynamic { asymmetric: false } => write!(f, "int8-dynamic:sym"),
            QuantScheme::Int8Static { observer } => match observer {
                Observer::MinMax => write!(f, "int8-static"),
                Observer::Percentile(p) => write!(f, "int8-static:observer=percentile={p}"),
                Observer::Mse => write!(f, "int8-static:observer=mse"),
            },
            QuantScheme::Int4Weight { group, asymmetric, clip_search } => {
                write!(f, "int4-weight:group={group}")?;
                if *asymmetric {
                    write!(f, ":asym")?;
                }
                if !clip_search {
                    write!(f, ":clip=none")?;
                }
                Ok(())
            }
        }
    }
}

/// What to quantize.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizeConfig {
    pub scheme: QuantScheme,
    /// Weights whose Python name (`ValueAttrs::origin`, `encoder.0.fc1.weight`)
    /// matches one of these globs (`*`, `?`) stay f32.
    pub skip: Vec<String>,
    /// Keep the first / last layer (linear or convolution, in schedule order) in f32.
    pub keep_first: bool,
    pub keep_last: bool,
    /// What each linear layer's input took on the calibration samples, in
    /// [`layer_inputs`]' order (the compiler fills it: `--calibration`).
    pub activations: Vec<ActObservation>,
    /// `--quantize auto`: the largest drop of the output cosine against the
    /// float program (its worst calibration sample) the compiler's search
    /// may accept; `scheme` is the ladder's first rung.
    pub auto_max_cosine_drop: Option<f64>,
    /// int8-static gives depthwise convolutions (2-d, one channel per
    /// group) static int8 activations too (the CPU target's
    /// `kiln_kernels::quant::qconv_depthwise`; the compiler clears it for
    /// other targets). On by default (the integer kernel takes ~0.8× the
    /// f32 one's time on MobileNetV2's layers, `benches/RESULTS.md`, and
    /// lets the `quant_acts` handoff run through inverted residual
    /// blocks); off, they keep f32 activations as other grouped ones.
    pub int8_depthwise: bool,
}

impl QuantizeConfig {
    pub fn new(scheme: QuantScheme) -> QuantizeConfig {
        QuantizeConfig {
            scheme,
            skip: Vec::new(),
            keep_first: false,
            keep_last: false,
            activations: Vec::new(),
            auto_max_cosine_drop: None,
            int8_depthwise: true,
        }
    }

    /// Whether the configuration needs calibration samples: static
    /// activations need [`QuantizeConfig::activations`], and `auto`
    /// measures each choice on them.
    pub fn needs_calibration(&self) -> bool {
        self.auto_max_cosine_drop.is_some() || matches!(self.scheme, QuantScheme::Int8Static { .. })
    }

    /// Whether the scheme uses [`QuantizeConfig::activations`] when given
    /// (int4 fits its scales to the activation magnitudes, int8-dynamic
    /// smooths the activations' outlier channels into the weights).
    pub fn uses_calibration(&self) -> bool {
        matches!(
            self.scheme,
            QuantScheme::Int8Static { .. } | QuantScheme::Int4Weight { .. } | QuantScheme::Int8Dynamic { .. }
        )
    }
}

/// One linear layer, quantized or kept.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerReport {
    /// The weight's Python name, or `linear#i` (the i-th layer) without one.
    pub name: String,
    pub n: usize,
    pub k: usize,
    /// `None`: kept in f32, for the reason in `note`.
    pub bits: Option<u8>,
    pub group: usize,
    /// Bytes of the f32 weight, and of the quantized weight, scales and zero points.
    pub float_bytes: usize,
    pub quant_bytes: usize,
    /// Signal-to-quantization-noise ratio of the dequantized weight, in dB.
    pub weight_sqnr_db: f64,
    /// Static activations: the scale and zero point chosen.
    pub act_qparams: Option<(f32, i32)>,
    /// With calibration samples: the SQNR of the layer's output in the
    /// quantized program against the float one, over the samples, in dB.
    pub output_sqnr_db: Option<f64>,
    pub note: String,
}

/// Quantizes the linear layers `cfg` selects; returns one report per layer found.
pub fn quantize_weights(g: &mut Graph, cfg: &QuantizeConfig) -> Result<Vec<LayerReport>, PassError> {
    let layers = plan_layers(g, cfg)?;
    apply_layers(g, layers)
}

/// One linear layer's quantization as [`plan_layers`] chose it, not yet
/// applied: [`apply_layers`] rewrites the graph (or any clone of it that
/// keeps its nodes) with a list of them, so the compiler's `--quantize
/// auto` search quantizes each layer once per scheme and tries mixes.
#[derive(Clone)]
pub struct LayerQuant {
    pub report: LayerReport,
    node: NodeId,
    chosen: Option<Chosen>,
}

impl LayerQuant {
    /// The same layer kept in f32, `note` saying why.
    pub fn kept(&self, note: &str) -> LayerQuant {
        let report = LayerReport {
            bits: None,
            group: self.report.k,
            quant_bytes: 0,
            weight_sqnr_db: f64::INFINITY,
            act_qparams: None,
            output_sqnr_db: None,
            note: note.to_string(),
            ..self.report.clone()
        };
        LayerQuant { report, node: self.node, chosen: None }
    }
}

/// What [`quantize_weights`] would do to each linear layer found (in
/// [`layer_inputs`]' order), without changing the graph.
pub fn plan_layers(g: &Graph, cfg: &QuantizeConfig) -> Result<Vec<LayerQuant>, PassError> {
    crate::check::guard(g, "quantize")?;
    let layers = find_layers(g);
    let is_static = matches!(cfg.scheme, QuantScheme::Int8Static { .. });
    if (is_static || !cfg.activations.is_empty()) && cfg.activations.len() != layers.len() {
        let detail = format!(
            "int8-static needs calibration (--calibration DIR): {} activation observations for {} linear layers",
            cfg.activations.len(),
            layers.len()
        );
        return Err(PassError::new("quantize", detail));
    }
    let mut planned = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let name = g.values[layer.weight].attrs.origin.clone().unwrap_or_else(|| format!("linear#{i}"));
        let (n, k) = layer.dims;
        let mut report = LayerReport {
            name: name.clone(),
            n,
            k,
            bits: None,
            group: k,
            float_bytes: n * k * 4,
            quant_bytes: 0,
            weight_sqnr_db: f64::INFINITY,
            act_qparams: None,
            output_sqnr_db: None,
            note: String::new(),
        };
        let scheme = &cfg.scheme;
        let kept = if cfg.keep_first && i == 0 {
            Some("the first layer (kept in f32)".to_string())
        } else if cfg.keep_last && i + 1 == layers.len() {
            Some("the last layer (kept in f32)".to_string())
        } else if let Some(glob) = cfg.skip.iter().find(|p| glob_match(p, &name)) {
            Some(format!("skipped by `{glob}`"))
        } else if let (&QuantScheme::Int4Weight { group, .. }, None) = (scheme, layer.conv_groups) {
            (!k.is_multiple_of(group)).then(|| format!("group {group} does not divide in_features {k}"))
        } else {
            None
        };
        if let Some(note) = kept {
            report.note = note;
            planned.push(LayerQuant { report, node: layer.node, chosen: None });
            continue;
        }
        if let Some(groups) = layer.conv_groups {
            let dw = cfg.int8_depthwise && is_depthwise(g, layer, groups);
            planned.push(plan_conv(g, layer, groups, dw, scheme, cfg.activations.get(i), report));
            continue;
        }
        let acts = scheme_acts(scheme, cfg.activations.get(i), &mut report);
        let w = f32_weight(g, layer.weight);
        let attrs = g.values[layer.weight].attrs.clone();
        let magnitudes = cfg.activations.get(i).and_then(|o| Magnitudes::of(o, k));
        let (qw, input_scale) = match (scheme, &magnitudes) {
            (QuantScheme::Int4Weight { .. }, Some(m)) => activation_aware(&w, n, k, scheme, m, attrs),
            (&QuantScheme::Int8Dynamic { asymmetric }, Some(_)) => {
                smooth_dynamic(&w, n, k, &cfg.activations[i], asymmetric, attrs)
            }
            _ => (quantize_matrix(&w, n, k, scheme, None, attrs), None),
        };
        report.bits = Some(qw.bits());
        report.group = qw.group;
        report.quant_bytes = qw.stored_bytes();
        // Against the f32 weight: the stored weight undone by the input scaling.
        let mut dq = qw.dequantized();
        if let Some(s) = &input_scale {
            dq.iter_mut().enumerate().for_each(|(i, v)| *v /= s[i % k]);
            report.note = "activation-aware input scaling".into();
        }
        report.weight_sqnr_db = sqnr_db(&w, &dq);
        planned.push(LayerQuant { report, node: layer.node, chosen: Some((qw, acts, input_scale)) });
    }
    Ok(planned)
}

/// The activations `scheme` gives a layer: static ones from its
/// observation (their parameters recorded in `report`), dynamic, or f32.
fn scheme_acts(scheme: &QuantScheme, observed: Option<&ActObservation>, report: &mut LayerReport) -> Acts {
    match (scheme, observed) {
        (&QuantScheme::Int8Static { observer }, Some(o)) => {
            let (scale, zero_point) = o.qparams(observer);
            report.act_qparams = Some((scale, zero_point));
            Acts::Static { scale, zero_point }
        }
        (QuantScheme::Int8Dynamic { asymmetric: false }, _) => Acts::Dynamic,
        (QuantScheme::Int8Dynamic { asymmetric: true }, _) => Acts::DynamicAsymmetric,
        _ => Acts::Float,
    }
}

/// Whether a grouped convolution is 2-d depthwise: one input and one
/// output channel per group.
fn is_depthwise(g: &Graph, layer: &Layer, groups: i64) -> bool {
    let node = &g.nodes[layer.node];
    let (x, w) = (g.ty(node.inputs[0]), g.ty(layer.weight));
    let dim = |t: &kiln_ir::TensorType, i: usize| t.shape.get(i).and_then(|d| d.as_const());
    x.rank() == 4 && dim(w, 1) == Some(1) && dim(w, 0) == Some(groups) && dim(x, 1) == Some(groups)
}

/// A convolution's quantization: int8 weights per output channel (torchao's
/// symmetric rule, as linear layers), the activations as the scheme says
/// where the kernel runs them (dense convolutions, and depthwise ones with
/// static activations when `int8_depthwise`); other grouped and depthwise
/// convolutions, and every convolution under an int4 scheme, keep f32
/// activations over int8 weights (the report's note says so).
fn plan_conv(
    g: &Graph,
    layer: &Layer,
    groups: i64,
    int8_depthwise: bool,
    scheme: &QuantScheme,
    observed: Option<&ActObservation>,
    mut report: LayerReport,
) -> LayerQuant {
    let (n, k) = layer.dims;
    let dense = groups == 1 || (int8_depthwise && matches!(scheme, QuantScheme::Int8Static { .. }));
    let acts = if dense { scheme_acts(scheme, observed, &mut report) } else { Acts::Float };
    report.note = match scheme {
        QuantScheme::Int4Weight { .. } => "convolution: int8 weights (int4 is for linear layers)".into(),
        QuantScheme::Int8Static { .. } if groups != 1 && dense => {
            format!("depthwise convolution ({groups} groups): int8 weights, static int8 activations")
        }
        QuantScheme::Int8Static { .. } | QuantScheme::Int8Dynamic { .. } if !dense => {
            format!("convolution with {groups} groups: int8 weights, f32 activations")
        }
        _ => String::new(),
    };
    let w = f32_weight(g, layer.weight);
    let attrs = g.values[layer.weight].attrs.clone();
    let qw = quantize_matrix(&w, n, k, &QuantScheme::Int8Weight, None, attrs);
    report.bits = Some(8);
    report.group = k;
    report.quant_bytes = qw.stored_bytes();
    report.weight_sqnr_db = sqnr_db(&w, &qw.dequantized());
    LayerQuant { report, node: layer.node, chosen: Some((qw, acts, None)) }
}

/// Rewrites the layers of `layers` that are quantized; returns their reports.
pub fn apply_layers(g: &mut Graph, layers: Vec<LayerQuant>) -> Result<Vec<LayerReport>, PassError> {
    let mut reports = Vec::with_capacity(layers.len());
    let mut by_node = std::collections::HashMap::new();
    for l in layers {
        reports.push(l.report);
        if let Some(chosen) = l.chosen {
            if g.nodes.get(l.node).is_none() {
                return Err(PassError::new("quantize", "a planned layer is not in this graph"));
            }
            by_node.insert(l.node, chosen);
        }
    }
    rewrite_in_order(g, |g, n| {
        let Some((qw, acts, input_scale)) = by_node.remove(&n) else { return Ok(Rewrite::Keep) };
        let node = &g.nodes[n];
        if let Op::Conv { stride, padding, dilation, groups } = &node.op {
            let conv = crate::quant_linear::ConvAttrs {
                stride: stride.clone(),
                padding: padding.clone(),
                dilation: dilation.clone(),
                groups: *groups,
                weight_shape: g.ty(node.inputs[1]).shape.clone(),
                bias: node.inputs.get(2).copied(),
            };
            let (x, out_ty, loc) = (node.inputs[0], g.ty(node.outputs[0]).clone(), node.loc);
            let (op, inputs) = qw.into_conv_operands(g, x, acts, conv);
            return Ok(Rewrite::Replace(vec![g.push(op, inputs, out_ty, loc)]));
        }
        let (mut x, bias) = (node.inputs[0], node.inputs.get(2).copied().filter(|_| node.op == Op::Linear));
        let out_ty = g.ty(node.outputs[0]).clone();
        let loc = node.loc;
        if let Some(s) = input_scale {
            // x / s, as x · (1 / s): the weight was quantized as W · diag(s).
            let inv: Vec<u8> = s.iter().flat_map(|v| (1.0 / v).to_le_bytes()).collect();
            let inv = g.add_const(None, TensorType::fixed(DType::F32, &[s.len() as i64]), ConstBytes::owned(inv));
            let x_ty = g.ty(x).clone();
            x = g.push(Op::Binary(BinaryOp::Mul), vec![x, inv], x_ty, loc);
        }
        let (op, mut inputs) = qw.into_operands(g, x, acts);
        inputs.extend(bias);
        Ok(Rewrite::Replace(vec![g.push(op, inputs, out_ty, loc)]))
    })?;
    // addmm's bias, added after the product.
    absorb_columns(g)?;
    Ok(reports)
}

/// `--quantize auto`'s rungs from `base`, most compressed first: `base`,
/// then int8 weights with f32 activations (the most accurate integer
/// scheme), then f32 (`None`).
pub fn auto_ladder(base: &QuantScheme) -> Vec<Option<QuantScheme>> {
    let mut rungs = vec![Some(base.clone())];
    if *base != QuantScheme::Int8Weight {
        rungs.push(Some(QuantScheme::Int8Weight));
    }
    rungs.push(None);
    rungs
}

/// The input `x` of every linear layer [`quantize_weights`] finds, in its
/// order: the values calibration observes.
pub fn layer_inputs(g: &Graph) -> Vec<ValueId> {
    find_layers(g).iter().map(|l| g.nodes[l.node].inputs[0]).collect()
}

/// The product each of those layers computes (before addmm's bias), in the
/// same order: what the report compares between the float and the
/// quantized program.
pub fn layer_outputs(g: &Graph) -> Vec<ValueId> {
    find_layers(g).iter().map(|l| g.nodes[l.node].outputs[0]).collect()
}

struct Layer {
    node: NodeId,
    weight: ValueId,
    /// Rows (output features or channels) and the weights of each.
    dims: (usize, usize),
    /// A convolution's groups; `None` for a linear layer.
    conv_groups: Option<i64>,
}

/// Linear layers with a constant f32 `[N, K]` weight and convolutions with
/// a constant f32 weight, in schedule order.
fn find_layers(g: &Graph) -> Vec<Layer> {
    let weight = |v: ValueId| -> Option<(ValueId, (usize, usize))> {
        g.const_of(v)?;
        let ty = g.ty(v);
        let dims = ty.static_shape()?;
        match (ty.dtype, &dims[..]) {
            (DType::F32, &[n, k]) if n > 0 && k > 0 => Some((v, (n as usize, k as usize))),
            _ => None,
        }
    };
    g.order
        .iter()
        .filter_map(|&n| {
            let node = &g.nodes[n];
            let (w, dims) = match (&node.op, &node.inputs[..]) {
                (Op::Linear, [_, w, ..]) => weight(*w)?,
                (Op::MatMul, &[x, wt]) if g.ty(x).rank() >= 2 => {
                    let p = g.producer(wt)?;
                    match (&g.nodes[p].op, &g.nodes[p].inputs[..]) {
                        (Op::Permute { perm }, &[w]) if perm == &[1, 0] => weight(w)?,
                        _ => return None,
                    }
                }
                (Op::Conv { groups, .. }, [_, w, ..]) => return conv_layer(g, n, *w, *groups),
                _ => return None,
            };
            Some(Layer { node: n, weight: w, dims, conv_groups: None })
        })
        .collect()
}

/// A convolution with a constant f32 weight `[Cout, C/groups, k..]`: a layer
/// of `Cout` rows of `C/groups · taps` weights.
fn conv_layer(g: &Graph, node: NodeId, w: ValueId, groups: i64) -> Option<Layer> {
    g.const_of(w)?;
    let ty = g.ty(w);
    let dims: Vec<usize> = ty.static_shape()?.into_iter().map(|d| usize::try_from(d).ok()).collect::<Option<_>>()?;
    let (&n, rest) = dims.split_first()?;
    let k: usize = rest.iter().product();
    let ok = ty.dtype == DType::F32 && (3..=5).contains(&dims.len()) && n > 0 && k > 0;
    ok.then_some(Layer { node, weight: w, dims: (n, k), conv_groups: Some(groups) })
}

fn f32_weight(g: &Graph, v: ValueId) -> Vec<f32> {
    let bytes = g.const_of(v).map(|c| c.bytes.as_bytes()).unwrap_or_default();
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// `10 log10(Σ w² / Σ (w − ŵ)²)`; infinite for an exact copy.
pub fn sqnr_db(w: &[f32], dq: &[f32]) -> f64 {
    let signal: f64 = w.iter().map(|&v| (v as f64).powi(2)).sum();
    let noise: f64 = w.iter().zip(dq).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
    if noise == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (signal / noise).log10()
    }
}

/// Per input channel: the mean `|x|` and mean `x²` of a layer's input on
/// the calibration samples.
struct Magnitudes {
    mean_abs: Vec<f64>,
    mean_sq: Vec<f64>,
    /// The whole input rows kept (may be empty).
    rows: Vec<f32>,
}

impl Magnitudes {
    fn of(o: &ActObservation, k: usize) -> Option<Magnitudes> {
        if o.channel_abs.len() != k || o.rows == 0 {
            return None;
        }
        let rows = o.rows as f64;
        Some(Magnitudes {
            mean_abs: o.channel_abs.iter().map(|v| v / rows).collect(),
            mean_sq: o.channel_sq.iter().map(|v| v / rows).collect(),
            rows: o.kept_rows.clone(),
        })
    }
}

/// Exponents tried for the activation-aware input scaling `s_c = mean|x_c|^α`.
const AWQ_ALPHAS: [f64; 9] = [0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0];

/// Activation-aware int4 (AWQ-style): the weight's columns scaled by `s_c
/// = mean|x_c|^α` (normalised to a geometric mean of 1) before group-wise
/// quantization, the input divided by `s` at run time, so that channels
/// with large activations get finer steps. Each group's clipping minimises
/// the error weighted by `E[x_c²]`, the layer output's error to first
/// order; α is chosen by that same error over the whole weight (a coarse
/// clipping search per α, then the full one for the chosen α). `α = 0`
/// (no scaling; returned as `None`) is the activation-weighted MSE
/// clipping alone.
fn activation_aware(
    w: &[f32],
    n: usize,
    k: usize,
    scheme: &QuantScheme,
    m: &Magnitudes,
    attrs: kiln_ir::ValueAttrs,
) -> (QuantWeight, Option<Vec<f32>>) {
    let scaling = |alpha: f64| -> Vec<f32> {
        let raw: Vec<f64> = m.mean_abs.iter().map(|&a| a.max(1e-8).powf(alpha)).collect();
        let log_mean = raw.iter().map(|v| v.ln()).sum::<f64>() / k as f64;
        raw.iter().map(|v| ((v.ln() - log_mean).exp() as f32).clamp(1e-4, 1e4)).collect()
    };
    let coarse = match *scheme {
        QuantScheme::Int4Weight { group, asymmetric, clip_search: true } => {
            QuantScheme::Int4Weight { group, asymmetric, clip_search: false }
        }
        ref other => other.clone(),
    };
    let attempt = |alpha: f64, scheme: &QuantScheme| {
        let s = scaling(alpha);
        let scaled: Vec<f32> = w.iter().enumerate().map(|(i, &v)| v * s[i % k]).collect();
        // Error in the original space: (w'_c − ŵ'_c) / s_c, weighted by E[x_c²].
        let imp: Vec<f64> = (0..k).map(|c| m.mean_sq[c] / (s[c] as f64).powi(2)).collect();
        let qw = quantize_matrix(&scaled, n, k, scheme, Some(&imp), attrs.clone());
        let dq = qw.dequantized();
        let err: f64 =
            scaled.iter().zip(&dq).enumerate().map(|(i, (&a, &b))| imp[i % k] * (a as f64 - b as f64).powi(2)).sum();
        (err, qw, s)
    };
    let best = AWQ_ALPHAS
        .iter()
        .map(|&alpha| (attempt(alpha, &coarse).0, alpha))
        .fold((f64::INFINITY, 0.0), |b, c| if c.0 < b.0 { c } else { b })
        .1;
    let (_, qw, s) = attempt(best, scheme);
    // With calibration rows, GPTQ's error feedback on the same scaled
    // weight, kept where it lowers the output error on those rows.
    let rows = m.rows.len() / k;
    let qw = match (rows, scheme) {
        (1.., &QuantScheme::Int4Weight { group, asymmetric, clip_search }) => {
            let scaled: Vec<f32> = w.iter().enumerate().map(|(i, &v)| v * s[i % k]).collect();
            let xs: Vec<f32> = m.rows.iter().enumerate().map(|(i, &v)| v / s[i % k]).collect();
            let ratios: &[f32] = if clip_search { &CLIP_RATIOS } else { &[1.0] };
            let gq = gptq(&scaled, n, k, &xs, group, (-8, 7), asymmetric, ratios, attrs);
            let err = |q: &QuantWeight| output_error(&scaled, &q.dequantized(), n, k, &xs);
            if err(&gq) < err(&qw) {
                gq
            } else {
                qw
            }
        }
        _ => qw,
    };
    (qw, (best > 0.0).then_some(s))
}

/// `Σ_rows ‖x · (w − ŵ)ᵀ‖²`: a linear layer's output error on `xs`.
fn output_error(w: &[f32], dq: &[f32], n: usize, k: usize, xs: &[f32]) -> f64 {
    let diff: Vec<f32> = w.iter().zip(dq).map(|(a, b)| a - b).collect();
    debug_assert_eq!(diff.len(), n * k);
    xs.chunks_exact(k).map(|x| diff.chunks_exact(k).map(|d| (dot(x, d) as f64).powi(2)).sum::<f64>()).sum()
}

/// GPTQ (Frantar et al. 2022) for group-wise weights: the columns of `w`
/// (`[n, k]`) are quantized in order, and each column's rounding error is
/// spread over the columns not yet quantized through the upper Cholesky
/// factor of the inverse of `H = Σ x xᵀ` (the layer inputs `xs`, damped by
/// 1% of its mean diagonal), which minimises the output error `‖x (w −
/// ŵ)ᵀ‖²` the rounding adds, column by column. Each group's scale and zero
/// point are chosen (with the clipping search) from the updated weights
/// when its first column is reached.
#[allow(clippy::too_many_arguments)]
fn gptq(
    w: &[f32],
    n: usize,
    k: usize,
    xs: &[f32],
    group: usize,
    range: (i32, i32),
    asymmetric: bool,
    ratios: &[f32],
    attrs: kiln_ir::ValueAttrs,
) -> QuantWeight {
    let mut h = vec![0f64; k * k];
    for x in xs.chunks_exact(k) {
        for (a, &xa) in x.iter().enumerate() {
            let xa = xa as f64;
            for (hv, &xb) in h[a * k..(a + 1) * k].iter_mut().zip(x) {
                *hv += xa * xb as f64;
            }
        }
    }
    let mean_diag = (0..k).map(|c| h[c * k + c]).sum::<f64>() / k as f64;
    let damp = 0.01 * mean_diag.max(1e-12);
    for c in 0..k {
        if h[c * k + c] == 0.0 {
            h[c * k + c] = 1.0;
        }
        h[c * k + c] += damp;
    }
    let u = upper_cholesky_of_inverse(&h, k);
    let mut work: Vec<f64> = w.iter().map(|&v| v as f64).collect();
    let groups = k / group;
    let mut q = vec![0i8; n * k];
    let mut scales = vec![0f32; n * groups];
    let mut zero_points = vec![0i8; n * groups];
    let mut scratch = vec![0i8; group];
    let mut err = vec![0f64; n];
    for c in 0..k {
        let g_col = c / group;
        if c % group == 0 {
            let imp: Vec<f64> = (c..c + group).map(|i| h[i * k + i]).collect();
            for j in 0..n {
                let cur: Vec<f32> = work[j * k + c..j * k + c + group].iter().map(|&v| v as f32).collect();
                let (s, zp) = best_params(&cur, &imp, range, asymmetric, ratios, &mut scratch);
                scales[j * groups + g_col] = s;
                zero_points[j * groups + g_col] = zp;
            }
        }
        let d = u[c * k + c];
        for j in 0..n {
            let (s, zp) = (scales[j * groups + g_col], zero_points[j * groups + g_col]);
            let v = work[j * k + c] as f32;
            let t = ((v * (1.0 / s)).round_ties_even() + zp as f32).clamp(range.0 as f32, range.1 as f32);
            q[j * k + c] = t as i8;
            let deq = ((t - zp as f32) * s) as f64;
            err[j] = (work[j * k + c] - deq) / d;
        }
        let urow = &u[c * k..(c + 1) * k];
        for j in 0..n {
            let e = err[j];
            for (wv, &uv) in work[j * k + c + 1..(j + 1) * k].iter_mut().zip(&urow[c + 1..]) {
                *wv -= e * uv;
            }
        }
    }
    let zero_points = zero_points.iter().any(|&z| z != 0).then_some(zero_points);
    QuantWeight { n, k, group, q, scales, zero_points, attrs }
}

/// The upper Cholesky factor `U` (`H⁻¹ = Uᵀ U`) of the inverse of the
/// symmetric positive definite `h` (`k × k`, row-major).
fn upper_cholesky_of_inverse(h: &[f64], k: usize) -> Vec<f64> {
    // H = L Lᵀ; H⁻¹ = L⁻ᵀ L⁻¹; then the Cholesky factor of H⁻¹.
    let l = cholesky_lower(h, k);
    // L⁻¹ by forward substitution, column by column.
    let mut linv = vec![0f64; k * k];
    for col in 0..k {
        for i in col..k {
            let mut sum = if i == col { 1.0 } else { 0.0 };
            for p in col..i {
                sum -= l[i * k + p] * linv[p * k + col];
            }
            linv[i * k + col] = sum / l[i * k + i];
        }
    }
    // H⁻¹ = L⁻ᵀ L⁻¹: (a, b) = Σ_p linv[p][a] · linv[p][b], p ≥ max(a, b).
    let mut inv = vec![0f64; k * k];
    for a in 0..k {
        for b in a..k {
            let v: f64 = (b..k).map(|p| linv[p * k + a] * linv[p * k + b]).sum();
            inv[a * k + b] = v;
            inv[b * k + a] = v;
        }
    }
    let lower = cholesky_lower(&inv, k);
    // U = Lᵀ of H⁻¹'s factor.
    let mut u = vec![0f64; k * k];
    for i in 0..k {
        for j in 0..=i {
            u[j * k + i] = lower[i * k + j];
        }
    }
    u
}

/// The lower Cholesky factor of the symmetric positive definite `a`
/// (`k × k`); a pivot that is not positive (rounding) is clamped small.
fn cholesky_lower(a: &[f64], k: usize) -> Vec<f64> {
    let mut l = vec![0f64; k * k];
    for i in 0..k {
        for j in 0..=i {
            let dot: f64 = (0..j).map(|p| l[i * k + p] * l[j * k + p]).sum();
            if i == j {
                l[i * k + i] = (a[i * k + i] - dot).max(1e-12).sqrt();
            } else {
                l[i * k + j] = (a[i * k + j] - dot) / l[j * k + j];
            }
        }
    }
    l
}

/// Calibration rows the smoothing search quantizes per candidate.
const SMOOTH_ROWS: usize = 128;

/// int8-dynamic with calibration (SmoothQuant-style): the weight's columns
/// scaled by `s_c = max|x_c|^α / max_j |w_jc|^(1−α)` (normalised to a
/// geometric mean of 1) and the input divided by `s` at run time. That
/// moves the range of the activations' outlier channels (BERT's, after
/// its layer norms) into the weights, so that each token's int8 scale is
/// no longer set by a few channels. The candidates — no scaling, and each
/// α — are compared by the layer's output error on the kept calibration
/// rows, each quantized as the kernel does (per-token activations,
/// `asymmetric` or not; per-channel weights); no scaling wins ties.
fn smooth_dynamic(
    w: &[f32],
    n: usize,
    k: usize,
    o: &ActObservation,
    asymmetric: bool,
    attrs: kiln_ir::ValueAttrs,
) -> (QuantWeight, Option<Vec<f32>>) {
    let scheme = QuantScheme::Int8Dynamic { asymmetric };
    let plain = || (quantize_matrix(w, n, k, &scheme, None, attrs.clone()), None);
    let kept = o.kept_rows.len() / k;
    if kept == 0 || o.channel_max.len() != k {
        return plain();
    }
    // At most SMOOTH_ROWS of them, spread over the samples.
    let xs: Vec<f32> = o.kept_rows.chunks_exact(k).step_by(kept.div_ceil(SMOOTH_ROWS)).flatten().copied().collect();
    let xs = &xs[..];
    let w_max: Vec<f64> = (0..k).map(|c| (0..n).map(|j| w[j * k + c].abs() as f64).fold(1e-8, f64::max)).collect();
    let scaling = |alpha: f64| -> Vec<f32> {
        let raw: Vec<f64> =
            (0..k).map(|c| (o.channel_max[c] as f64).max(1e-8).powf(alpha) / w_max[c].powf(1.0 - alpha)).collect();
        let log_mean = raw.iter().map(|v| v.ln()).sum::<f64>() / k as f64;
        raw.iter().map(|v| ((v.ln() - log_mean).exp() as f32).clamp(1e-4, 1e4)).collect()
    };
    // The float layer's output on the rows, then each candidate's.
    let want: Vec<f32> = xs.chunks_exact(k).flat_map(|x| w.chunks_exact(k).map(|wr| dot(x, wr))).collect();
    let attempt = |s: Option<Vec<f32>>| -> (f64, QuantWeight, Option<Vec<f32>>) {
        let qw = match &s {
            Some(s) => {
                let scaled: Vec<f32> = w.iter().enumerate().map(|(i, &v)| v * s[i % k]).collect();
                quantize_matrix(&scaled, n, k, &scheme, None, attrs.clone())
            }
            None => quantize_matrix(w, n, k, &scheme, None, attrs.clone()),
        };
        let wq = qw.dequantized();
        let inv: Option<Vec<f32>> = s.as_ref().map(|s| s.iter().map(|v| 1.0 / v).collect());
        let mut err = 0f64;
        let mut row = vec![0f32; k];
        for (r, x) in xs.chunks_exact(k).enumerate() {
            match &inv {
                Some(inv) => row.iter_mut().zip(x).zip(inv).for_each(|((o, &v), &i)| *o = v * i),
                None => row.copy_from_slice(x),
            }
            fake_quant_token(&mut row, asymmetric);
            for (j, wr) in wq.chunks_exact(k).enumerate() {
                err += (dot(&row, wr) as f64 - want[r * n + j] as f64).powi(2);
            }
        }
        (err, qw, s)
    };
    let mut best = attempt(None);
    for &alpha in &AWQ_ALPHAS {
        let candidate = attempt(Some(scaling(alpha)));
        if candidate.0 < best.0 {
            best = candidate;
        }
    }
    (best.1, best.2)
}

/// The kernel's per-token int8 quantization of one row, undone. Symmetric
/// (torchao's): `s = max|x| / 127.5`, `q = clamp(rint(x · (1 / s)), -128,
/// 127)`, `q · s`; asymmetric: `s`, `zp` from the row's range
/// ([`crate::observe::range_qparams`], the rule of
/// `kiln_kernels::quant::row_qparams_asymmetric`), `(q − zp) · s`.
fn fake_quant_token(row: &mut [f32], asymmetric: bool) {
    let (s, zp) = if asymmetric {
        let (mn, mx) = row.iter().fold((0f32, 0f32), |(mn, mx), &v| (mn.min(v), mx.max(v)));
        crate::observe::range_qparams(mn, mx)
    } else {
        let m = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        ((m / 127.5).max(f32::EPSILON), 0)
    };
    let (inv, zp) = (1.0 / s, zp as f32);
    row.iter_mut().for_each(|v| *v = ((*v * inv).round_ties_even() + zp).clamp(-128.0, 127.0) - zp);
    row.iter_mut().for_each(|v| *v *= s);
}

/// `Σ a·b` in f32, eight partial sums (vectorisable).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Quantizes a row-major `[n, k]` matrix (see the module doc); `imp` (one
/// per input channel) weights each element's squared error in the
/// clipping search.
fn quantize_matrix(
    w: &[f32],
    n: usize,
    k: usize,
    scheme: &QuantScheme,
    imp: Option<&[f64]>,
    attrs: kiln_ir::ValueAttrs,
) -> QuantWeight {
    let (group, range, asymmetric, clip_search) = match *scheme {
        QuantScheme::Int8Weight | QuantScheme::Int8Dynamic { .. } | QuantScheme::Int8Static { .. } => {
            (k, (-128, 127), false, false)
        }
        QuantScheme::Int4Weight { group, asymmetric, clip_search } => (group, (-8, 7), asymmetric, clip_search),
    };
    let ones = vec![1.0f64; k];
    let imp = imp.unwrap_or(&ones);
    let mut q = vec![0i8; n * k];
    let mut scales = Vec::with_capacity(n * (k / group));
    let mut zero_points = Vec::with_capacity(scales.capacity());
    for (g_index, chunk) in w.chunks_exact(group).enumerate() {
        let out = &mut q[g_index * group..][..group];
        let ratios: &[f32] = if clip_search { &CLIP_RATIOS } else { &[1.0] };
        let col = (g_index % (k / group)) * group;
        let (s, zp) = best_params(chunk, &imp[col..col + group], range, asymmetric, ratios, out);
        scales.push(s);
        zero_points.push(zp);
    }
    let zero_points = zero_points.iter().any(|&z| z != 0).then_some(zero_points);
    QuantWeight { n, k, group, q, scales, zero_points, attrs }
}

/// Clipping ratios tried per int4 group.
const CLIP_RATIOS: [f32; 41] = {
    let mut r = [0f32; 41];
    let mut i = 0;
    while i < 41 {
        r[i] = 1.0 - 0.01 * i as f32;
        i += 1;
    }
    r
};

/// The scale and zero point (over `ratios` of the full range) whose
/// dequantized group is closest to `w` in squared error, element `p`'s
/// weighted by `imp[p]`; writes the integers.
fn best_params(
    w: &[f32],
    imp: &[f64],
    range: (i32, i32),
    asymmetric: bool,
    ratios: &[f32],
    out: &mut [i8],
) -> (f32, i8) {
    let (mn, mx) = w.iter().fold((0f32, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let mut best: Option<(f64, f32, i8)> = None;
    let mut trial = vec![0i8; w.len()];
    let error = |s: f32, zp: i8, q: &[i8]| -> f64 {
        w.iter()
            .zip(q)
            .zip(imp)
            .map(|((&v, &t), &m)| m * (v as f64 - ((t as f32 - zp as f32) * s) as f64).powi(2))
            .sum()
    };
    // With the integers fixed, the weighted least-squares scale `Σ m·w·c /
    // Σ m·c²` (c = q − zp) is at least as good; requantizing with it may be
    // better still. A few rounds of both, with the clipping search only.
    let rounds = if ratios.len() > 1 { 3 } else { 1 };
    for &r in ratios {
        let (mut s, zp) = params(mn * r, mx * r, range, asymmetric);
        for round in 0..rounds {
            quantize_group(w, s, zp, range, &mut trial);
            let err = error(s, zp, &trial);
            if best.is_none_or(|(e, _, _)| err < e) {
                best = Some((err, s, zp));
                out.copy_from_slice(&trial);
            }
            let (num, den) = w.iter().zip(&trial).zip(imp).fold((0f64, 0f64), |(n, d), ((&v, &t), &m)| {
                let c = t as f64 - zp as f64;
                (n + m * v as f64 * c, d + m * c * c)
            });
            let refit = (num / den) as f32;
            if round + 1 == rounds || !(refit.is_finite() && refit > 0.0) {
                break;
            }
            let err_refit = error(refit, zp, &trial);
            if best.is_none_or(|(e, _, _)| err_refit < e) {
                best = Some((err_refit, refit, zp));
                out.copy_from_slice(&trial);
            }
            s = refit;
        }
    }
    best.map_or((1.0, 0), |(_, s, zp)| (s, zp))
}

/// torchao's `choose_qparams_affine` for a range `[mn, mx]` holding 0.
fn params(mn: f32, mx: f32, (qmin, qmax): (i32, i32), asymmetric: bool) -> (f32, i8) {
    if asymmetric {
        let s = ((mx - mn) / (qmax - qmin) as f32).max(f32::EPSILON);
        let zp = (qmin as f32 - (mn / s).round_ties_even()).clamp(qmin as f32, qmax as f32);
        (s, zp as i8)
    } else {
        let s = ((-mn).max(mx) / ((qmax - qmin) as f32 / 2.0)).max(f32::EPSILON);
        (s, 0)
    }
}

fn quantize_group(w: &[f32], s: f32, zp: i8, (qmin, qmax): (i32, i32), out: &mut [i8]) {
    let inv = 1.0 / s;
    for (o, &v) in out.iter_mut().zip(w) {
        *o = ((v * inv).round_ties_even() + zp as f32).clamp(qmin as f32, qmax as f32) as i8;
    }
}

/// `*` (any run) and `?` (one character) glob matching.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut si, mut star, mut mark) = (0, 0, None, 0);
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = si;
            pi += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*.fc1.weight", "encoder.0.fc1.weight"));
        assert!(glob_match("head*", "head.weight"));
        assert!(glob_match("layer?.w", "layer3.w"));
        assert!(!glob_match("layer?.w", "layer10.w"));
        assert!(!glob_match("fc1", "fc1.weight"));
    }

    #[test]
    fn modes_parse() {
        assert_eq!(QuantScheme::parse("int8-weight"), Ok(QuantScheme::Int8Weight));
        assert_eq!(
            QuantScheme::parse("int4-weight:group=64:asym"),
            Ok(QuantScheme::Int4Weight { group: 64, asymmetric: true, clip_search: true })
        );
        assert!(QuantScheme::parse("int4-weight:group=3").is_err());
        assert!(QuantScheme::parse("int8-weight:asym").is_err());
        assert_eq!(QuantScheme::parse("int8-dynamic"), Ok(QuantScheme::Int8Dynamic { asymmetric: true }));
        assert_eq!(QuantScheme::parse("int8-dynamic:sym"), Ok(QuantScheme::Int8Dynamic { asymmetric: false }));
        assert!(QuantScheme::parse("int8-dynamic:group=32").is_err());
        for m in [
            "int8-weight",
            "int8-dynamic",
            "int8-dynamic:sym",
            "int8-static",
            "int8-static:observer=percentile=99.5",
            "int8-static:observer=mse",
            "int4-weight:group=64:asym:clip=none",
        ] {
            assert_eq!(QuantScheme::parse(m).map(|s| s.to_string()).as_deref(), Ok(m), "round trip");
        }
        assert!(QuantScheme::parse("int3").is_err());
        assert_eq!(QuantScheme::parse("int8-static"), Ok(QuantScheme::Int8Static { observer: Observer::MinMax }));
        assert_eq!(
            QuantScheme::parse("int8-static:observer=percentile=99.9"),
            Ok(QuantScheme::Int8Static { observer: Observer::Percentile(99.9) })
        );
        assert!(QuantScheme::parse("int8-static:observer=max").is_err());
        assert!(QuantScheme::parse("int8-static:asym").is_err());
    }

    /// torchao's int8 rule, checked against torch 2.15: `s = 1 / 127.5`,
    /// `round(tensor([-1, 0.5, 0.25]) * (1.0 / s))` is `[-127, 64, 32]` (the
    /// f32 reciprocal lands just below 127.5).
    #[test]
    fn int8_rows_follow_torchao() {
        let w = [0.5f32, -1.0, 0.25, 0.0, 2.0, -0.5, 1.0, 0.125];
        let qw = quantize_matrix(&w, 2, 4, &QuantScheme::Int8Weight, None, Default::default());
        assert_eq!(qw.scales, vec![1.0 / 127.5, 2.0 / 127.5]);
        assert_eq!(qw.q[..4], [64, -127, 32, 0]);
        assert!(qw.zero_points.is_none());
    }

    /// Clipping never does worse than the full range (ratio 1 is tried).
    #[test]
    fn mse_clipping_beats_max_abs() {
        let w: Vec<f32> =
            (0..64).map(|i| ((i * 37 % 64) as f32 - 32.0) / 10.0 + if i == 5 { 9.0 } else { 0.0 }).collect();
        let err = |clip_search| {
            let s = QuantScheme::Int4Weight { group: 32, asymmetric: false, clip_search };
            let qw = quantize_matrix(&w, 1, 64, &s, None, Default::default());
            w.iter().zip(qw.dequantized()).map(|(a, b)| (a - b).powi(2)).sum::<f32>()
        };
        assert!(err(true) < err(false), "{} vs {}", err(true), err(false));
    }

    /// Rows whose two outlier channels are 50× the others': per-token int8
    /// steps are then set by the outliers; smoothing them into the weight
    /// lowers the layer's output error on those rows, and without
    /// outliers (uniform channels) the search may keep the plain weight.
    #[test]
    fn smoothing_lowers_int8_dynamic_output_error() {
        let (n, k, rows) = (16, 64, 96);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 29 % 61) as f32 - 30.0) / 40.0).collect();
        let xs: Vec<f32> = (0..rows * k)
            .map(|i| {
                let base = ((i * 37 % 101) as f32 - 50.0) / 50.0;
                if i % k == 3 || i % k == 17 {
                    base.signum() * 50.0 + base
                } else {
                    base
                }
            })
            .collect();
        let mut o = ActObservation::default();
        o.add(&xs, k);
        assert_eq!(o.kept_rows.len(), rows * k);
        for asymmetric in [false, true] {
            let out_err = |qw: &QuantWeight, s: Option<&Vec<f32>>| -> f64 {
                let wq = qw.dequantized();
                let mut err = 0.0;
                for x in xs.chunks_exact(k) {
                    let mut row: Vec<f32> = match s {
                        Some(s) => x.iter().zip(s).map(|(v, s)| v * (1.0 / s)).collect(),
                        None => x.to_vec(),
                    };
                    fake_quant_token(&mut row, asymmetric);
                    for (wr, wq) in w.chunks_exact(k).zip(wq.chunks_exact(k)) {
                        err += (dot(&row, wq) as f64 - dot(x, wr) as f64).powi(2);
                    }
                }
                err
            };
            let plain = quantize_matrix(&w, n, k, &QuantScheme::Int8Dynamic { asymmetric }, None, Default::default());
            let (qw, s) = smooth_dynamic(&w, n, k, &o, asymmetric, Default::default());
            assert!(s.is_some(), "outlier channels are smoothed");
            let (a, p) = (out_err(&qw, s.as_ref()), out_err(&plain, None));
            assert!(a < 0.5 * p, "asymmetric {asymmetric}: smoothed {a} vs plain {p}");
        }
    }

    /// `U` with `Uᵀ U = H⁻¹` (upper triangular).
    #[test]
    fn cholesky_of_the_inverse() {
        let k = 5;
        let mut h = vec![0f64; k * k];
        for a in 0..k {
            for b in 0..k {
                h[a * k + b] = 1.0 / (1.0 + a as f64 + b as f64) + if a == b { 1.0 } else { 0.0 };
            }
        }
        let u = upper_cholesky_of_inverse(&h, k);
        for a in 0..k {
            for b in 0..a {
                assert_eq!(u[a * k + b], 0.0);
            }
            for b in 0..k {
                // (Uᵀ U H)[a][b] = δ_ab.
                let v: f64 =
                    (0..k).map(|c| (0..k).map(|p| u[p * k + a] * u[p * k + c]).sum::<f64>() * h[c * k + b]).sum();
                assert!((v - if a == b { 1.0 } else { 0.0 }).abs() < 1e-9, "({a}, {b}): {v}");
            }
        }
    }

    /// Correlated inputs (a shared factor in every channel): GPTQ's error
    /// feedback gives a lower output error on them than rounding each
    /// weight to its nearest level with the same clipping search.
    #[test]
    fn gptq_lowers_int4_output_error() {
        let (n, k, rows) = (8, 64, 200);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 29 % 61) as f32 - 30.0) / 40.0).collect();
        let xs: Vec<f32> = (0..rows * k)
            .map(|i| {
                let (r, c) = (i / k, i % k);
                let shared = ((r * 13 % 17) as f32 - 8.0) / 4.0;
                shared * (1.0 + (c % 5) as f32 * 0.1) + ((i * 37 % 101) as f32 - 50.0) / 200.0
            })
            .collect();
        let scheme = QuantScheme::Int4Weight { group: 32, asymmetric: false, clip_search: true };
        let rtn = quantize_matrix(&w, n, k, &scheme, None, Default::default());
        let gq = gptq(&w, n, k, &xs, 32, (-8, 7), false, &CLIP_RATIOS, Default::default());
        let (e_rtn, e_gptq) =
            (output_error(&w, &rtn.dequantized(), n, k, &xs), output_error(&w, &gq.dequantized(), n, k, &xs));
        assert!(e_gptq < 0.7 * e_rtn, "gptq {e_gptq} vs round-to-nearest {e_rtn}");
        assert!(gq.q.iter().all(|&v| (-8..=7).contains(&v)));
    }

    /// Two input channels with activations 40× the others': scaling them
    /// (and weighting their error) lowers the layer's output error, to first
    /// order `Σ_c E[x_c²] Σ_j (w_jc − ŵ_jc)²`, below plain MSE clipping's.
    #[test]
    fn activation_aware_int4_lowers_output_error() {
        let (n, k) = (8, 64);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 29 % 61) as f32 - 30.0) / 40.0).collect();
        let mean_abs: Vec<f64> = (0..k).map(|c| if c == 3 || c == 17 { 20.0 } else { 0.5 }).collect();
        let m = Magnitudes { mean_sq: mean_abs.iter().map(|a| a * a * 1.2).collect(), mean_abs, rows: vec![] };
        let scheme = QuantScheme::Int4Weight { group: 32, asymmetric: false, clip_search: true };
        let out_err = |dq: &[f32]| -> f64 {
            w.iter().zip(dq).enumerate().map(|(i, (&a, &b))| m.mean_sq[i % k] * (a as f64 - b as f64).powi(2)).sum()
        };
        let plain = quantize_matrix(&w, n, k, &scheme, None, Default::default()).dequantized();
        let (qw, s) = activation_aware(&w, n, k, &scheme, &m, Default::default());
        let mut aware = qw.dequantized();
        if let Some(s) = &s {
            aware.iter_mut().enumerate().for_each(|(i, v)| *v /= s[i % k]);
        }
        let (a, p) = (out_err(&aware), out_err(&plain));
        assert!(a < 0.7 * p, "activation-aware {a} vs plain {p}");
    }
}
