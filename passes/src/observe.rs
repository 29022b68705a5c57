//! Activation observers for static int8 quantization: from the values a
//! layer's input took on the calibration samples, one per-tensor scale and
//! zero point over `[-128, 127]`.
//!
//! The range rule is torch's `MinMaxObserver` (`quint8`, per-tensor
//! affine), written for int8 storage: the range widened to hold 0, `s =
//! max((mx − mn) / 255, f32::EPSILON)`, `zp = clamp(−128 − rint(mn / s))` —
//! torch's uint8 zero point minus 128, so the same integers shifted. The
//! observers differ in the range they hand to it:
//! - `minmax`: the smallest and largest value seen;
//! - `percentile=P`: the P-th and (100 − P)-th percentiles (nearest rank),
//!   which drops rare outliers;
//! - `mse`: the full range shrunk by the ratio in `{1, 0.99, .., 0.30}`
//!   whose fake-quantized values have the least squared error.

/// How an activation's range is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Observer {
    MinMax,
    /// Percentile in `(50, 100]`.
    Percentile(f64),
    Mse,
}

impl Observer {
    /// `minmax`, `percentile[=P]` (99.99 by default), `mse`.
    pub fn parse(s: &str) -> Result<Observer, String> {
        match s {
            "minmax" => Ok(Observer::MinMax),
            "mse" => Ok(Observer::Mse),
            "percentile" => Ok(Observer::Percentile(99.99)),
            _ => match s.strip_prefix("percentile=").map(str::parse::<f64>) {
                Some(Ok(p)) if p > 50.0 && p <= 100.0 => Ok(Observer::Percentile(p)),
                _ => Err(format!("unknown observer `{s}` (minmax, percentile[=P] with 50 < P <= 100, mse)")),
            },
        }
    }
}

/// What one layer's input took over the calibration samples: its exact
/// range, and the values themselves (every one, or an evenly strided
/// subset of at most [`ActObservation::MAX_VALUES`]) for the observers that
/// look at the distribution.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ActObservation {
    pub min: f32,
    pub max: f32,
    pub values: Vec<f32>,
    /// Non-NaN values seen (all samples).
    pub count: u64,
    /// Per channel (the last dimension): `Σ |x|` and `Σ x²` over the rows
    /// seen, and the row count — the activation magnitudes the int4 weight
    /// scales are fitted to.
    pub channel_abs: Vec<f64>,
    pub channel_sq: Vec<f64>,
    pub rows: u64,
    /// Per channel: the largest `|x|` seen.
    pub channel_max: Vec<f32>,
    /// Whole rows (row-major, a channel count wide), at most
    /// [`ActObservation::MAX_ROWS`], spread over each sample: what the
    /// int8-dynamic smoothing search quantizes row by row and GPTQ's
    /// Hessian is built from.
    pub kept_rows: Vec<f32>,
}

impl ActObservation {
    /// Values kept per layer (the distribution's observers read these).
    pub const MAX_VALUES: usize = 1 << 20;
    /// Whole rows kept per layer.
    pub const MAX_ROWS: usize = 1024;

    /// Adds one sample's values, `channels` the size of their last
    /// dimension (NaNs are ignored).
    pub fn add(&mut self, xs: &[f32], channels: usize) {
        if channels > 0 && xs.len().is_multiple_of(channels) {
            if self.channel_abs.len() != channels {
                self.channel_abs = vec![0.0; channels];
                self.channel_sq = vec![0.0; channels];
                self.channel_max = vec![0.0; channels];
                self.kept_rows.clear();
                self.rows = 0;
            }
            for row in xs.chunks_exact(channels) {
                let sums = self.channel_abs.iter_mut().zip(&mut self.channel_sq).zip(&mut self.channel_max);
                for (((a, q), m), &v) in sums.zip(row) {
                    if !v.is_nan() {
                        *a += (v as f64).abs();
                        *q += (v as f64) * (v as f64);
                        *m = m.max(v.abs());
                    }
                }
                self.rows += 1;
            }
            let room = Self::MAX_ROWS.saturating_sub(self.kept_rows.len() / channels);
            let rows = xs.len() / channels;
            if room > 0 && rows > 0 {
                let stride = rows.div_ceil(room);
                for row in xs.chunks_exact(channels).step_by(stride) {
                    self.kept_rows.extend(row.iter().map(|v| if v.is_nan() { 0.0 } else { *v }));
                }
            }
        }
        let (mut mn, mut mx) = if self.count == 0 { (f32::INFINITY, f32::NEG_INFINITY) } else { (self.min, self.max) };
        for &v in xs.iter().filter(|v| !v.is_nan()) {
            mn = mn.min(v);
            mx = mx.max(v);
            self.count += 1;
        }
        if mn <= mx {
            (self.min, self.max) = (mn, mx);
        }
        let stride = xs.len().div_ceil(Self::MAX_VALUES / 8).max(1);
        self.values.extend(xs.iter().step_by(stride).filter(|v| !v.is_nan()));
        if self.values.len() > Self::MAX_VALUES {
            let keep = self.values.len().div_ceil(Self::MAX_VALUES);
            self.values = self.values.iter().step_by(keep).copied().collect();
        }
    }

    /// The scale and int8 zero point `observer` chooses.
    pub fn qparams(&self, observer: Observer) -> (f32, i32) {
        match observer {
            Observer::MinMax => range_qparams(self.min, self.max),
            Observer::Percentile(p) => {
                let mut sorted = self.values.clone();
                sorted.sort_by(f32::total_cmp);
                let at = |q: f64| -> f32 {
                    let i = ((q / 100.0) * (sorted.len().saturating_sub(1)) as f64).round() as usize;
                    sorted.get(i).copied().unwrap_or(0.0)
                };
                range_qparams(at(100.0 - p), at(p))
            }
            Observer::Mse => {
                let mut best = (f64::INFINITY, range_qparams(self.min, self.max));
                for i in 0..=70 {
                    let r = 1.0 - 0.01 * i as f32;
                    let (s, zp) = range_qparams(self.min * r, self.max * r);
                    let err = fake_quant_error(&self.values, s, zp);
                    if err < best.0 {
                        best = (err, (s, zp));
                    }
                }
                best.1
            }
        }
    }
}

/// torch's `MinMaxObserver` rule for `[mn, mx]` (see the module doc).
pub fn range_qparams(mn: f32, mx: f32) -> (f32, i32) {
    let (mn, mx) = (mn.min(0.0), mx.max(0.0));
    let s = ((mx - mn) / 255.0).max(f32::EPSILON);
    let zp = (-128.0 - (mn / s).round_ties_even()).clamp(-128.0, 127.0);
    (s, zp as i32)
}

/// `Σ (x − dq(q(x)))²` with torch's rounding.
fn fake_quant_error(xs: &[f32], s: f32, zp: i32) -> f64 {
    let inv = 1.0 / s;
    xs.iter()
        .map(|&x| {
            let q = ((x * inv).round_ties_even() + zp as f32).clamp(-128.0, 127.0);
            (x as f64 - ((q - zp as f32) * s) as f64).powi(2)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(xs: &[f32]) -> ActObservation {
        let mut o = ActObservation::default();
        o.add(xs, 1);
        o
    }

    /// torch 2.15: `MinMaxObserver(dtype=torch.quint8)` on `[-1.0, 3.0]`
    /// gives scale 0.015686275 (= 4 / 255 in f32) and zero point 64;
    /// on `[0.5, 2.0]` (range widened to 0) 0.007843138 and 0.
    #[test]
    fn minmax_is_torchs_rule() {
        let (s, zp) = observed(&[-1.0, 0.25, 3.0]).qparams(Observer::MinMax);
        assert_eq!((s, zp), (4.0f32 / 255.0, 64 - 128));
        let (s, zp) = observed(&[0.5, 2.0]).qparams(Observer::MinMax);
        assert_eq!((s, zp), (2.0f32 / 255.0, -128));
        // All zeros: the smallest scale, zero point at the bottom.
        assert_eq!(observed(&[0.0; 4]).qparams(Observer::MinMax), (f32::EPSILON, -128));
    }

    /// Uniform 0..=10000 with one outlier: the 99th percentile is 9900
    /// (nearest rank), the 1st 100; min-max would cover the outlier.
    #[test]
    fn percentile_drops_outliers() {
        let mut xs: Vec<f32> = (0..=10_000).map(|i| i as f32).collect();
        xs[5000] = -1e6;
        let o = observed(&xs);
        assert_eq!(o.qparams(Observer::Percentile(99.0)), range_qparams(100.0, 9900.0));
        assert_eq!(o.qparams(Observer::Percentile(100.0)), range_qparams(-1e6, 10_000.0));
        assert_eq!(o.qparams(Observer::MinMax), range_qparams(-1e6, 10_000.0));
    }

    /// 200k values spread over [-1, 1] and one at 100: min-max spends the
    /// range on the outlier; the squared error `10⁴ (1 − r)² + 2614 r²` is
    /// least near r = 0.79, so MSE clips (smaller scale, less error).
    #[test]
    fn mse_clips_outliers() {
        let mut xs: Vec<f32> = (0..200_000).map(|i| i as f32 / 100_000.0 - 1.0).collect();
        xs[1234] = 100.0;
        let o = observed(&xs);
        let (mm, mse) = (o.qparams(Observer::MinMax), o.qparams(Observer::Mse));
        let ratio = mse.0 / mm.0;
        assert!((0.74..0.84).contains(&ratio), "mse scale {} vs min-max {}", mse.0, mm.0);
        assert!(fake_quant_error(&xs, mse.0, mse.1) < 0.8 * fake_quant_error(&xs, mm.0, mm.1));
    }

    #[test]
    fn observers_parse_and_nans_are_ignored() {
        assert_eq!(Observer::parse("percentile"), Ok(Observer::Percentile(99.99)));
        assert_eq!(Observer::parse("percentile=99.9"), Ok(Observer::Percentile(99.9)));
        assert!(Observer::parse("percentile=20").is_err());
        assert!(Observer::parse("histogram").is_err());
        let o = observed(&[f32::NAN, -2.0, 1.0]);
        assert_eq!((o.min, o.max, o.values.len()), (-2.0, 1.0, 2));
        let mut o = ActObservation::default();
        o.add(&[1.0, 2.0], 2);
        o.add(&[-3.0, 0.5], 2);
        assert_eq!((o.min, o.max), (-3.0, 2.0));
        assert_eq!((o.channel_abs.clone(), o.channel_sq.clone(), o.rows), (vec![4.0, 2.5], vec![10.0, 4.25], 2));
    }
}
