//! Kernels with two outputs (`sort_both`, `max_pool_with_indices`) against
//! the two single-output calls they replace: identical values (bit for bit,
//! NaN where NaN) and identical indices, on ties, NaNs and several dtypes.

mod common;

use bytemuck::Pod;
use common::*;
use kiln_kernels::*;
use rand::Rng;

/// Rows with many ties, ±0, NaNs and infinities.
fn tricky_f64(r: &mut rand::rngs::StdRng, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| match r.gen_range(0..10) {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => f64::NEG_INFINITY,
            3 => -0.0,
            4 => 0.0,
            _ => r.gen_range(-3..4) as f64,
        })
        .collect()
}

fn same_bits<T: Pod>(a: &[T], b: &[T]) -> bool {
    bytemuck::cast_slice::<T, u8>(a) == bytemuck::cast_slice::<T, u8>(b)
}

/// `sort_both` against `sort` twice, for one input buffer.
fn check_sort(x: &Buf, axis: usize, k: usize, descending: bool) {
    let mut out_shape = x.shape.clone();
    out_shape[axis] = k;
    let mut cx = Context::new();
    let mut vals = Buf::zeros(x.dtype, &out_shape);
    let mut idx = Buf::zeros(DType::I64, &out_shape);
    sort(x.r(), axis, descending, false, vals.w(), &mut cx).unwrap();
    sort(x.r(), axis, descending, true, idx.w(), &mut cx).unwrap();
    let mut both_v = Buf::zeros(x.dtype, &out_shape);
    let mut both_i = Buf::zeros(DType::I64, &out_shape);
    sort_both(x.r(), axis, descending, both_v.w(), both_i.w(), &mut cx).unwrap();
    let ctx = format!("{:?} {:?} axis {axis} k {k} desc {descending}", x.dtype, x.shape);
    assert!(same_bits(&both_v.get::<u8>(), &vals.get::<u8>()), "values differ: {ctx}");
    assert_eq!(both_i.get::<i64>(), idx.get::<i64>(), "indices differ: {ctx}");
}

#[test]
fn sort_both_matches_two_sorts() {
    let mut r = rng(71);
    for shape in [vec![1usize], vec![7], vec![3, 17], vec![2, 5, 4], vec![4, 1, 33]] {
        let n: usize = shape.iter().product();
        let v = tricky_f64(&mut r, n);
        let bufs = [
            Buf::from(DType::F64, &shape, &v),
            Buf::from(DType::F32, &shape, &v.iter().map(|&x| x as f32).collect::<Vec<_>>()),
            Buf::from(DType::F16, &shape, &v.iter().map(|&x| half::f16::from_f64(x)).collect::<Vec<_>>()),
            Buf::from(
                DType::I64,
                &shape,
                &v.iter().map(|&x| if x.is_finite() { x as i64 } else { 9 }).collect::<Vec<_>>(),
            ),
            Buf::from(
                DType::I32,
                &shape,
                &v.iter().map(|&x| if x.is_finite() { x as i32 } else { -9 }).collect::<Vec<_>>(),
            ),
            Buf::from(DType::U8, &shape, &v.iter().map(|&x| (x.abs().min(9.0)) as u8).collect::<Vec<_>>()),
        ];
        for x in &bufs {
            for (axis, &len) in shape.iter().enumerate() {
                for k in [len, len.div_ceil(2), 1] {
                    for descending in [false, true] {
                        check_sort(x, axis, k, descending);
                    }
                }
            }
        }
    }
}

#[test]
fn sort_both_nan_last_and_stable_ties() {
    let x = f32s(&[1, 6], &[3.0, f32::NAN, 1.0, 3.0, 2.0, 0.0]);
    let mut cx = Context::new();
    let (mut v, mut i) = (Buf::zeros(DType::F32, &[1, 3]), Buf::zeros(DType::I64, &[1, 3]));
    sort_both(x.r(), 1, true, v.w(), i.w(), &mut cx).unwrap();
    let vals = v.get::<f32>();
    assert!(vals[0].is_nan() && vals[1] == 3.0 && vals[2] == 3.0);
    assert_eq!(i.get::<i64>(), vec![1, 0, 3]);
    sort_both(x.r(), 1, false, v.w(), i.w(), &mut cx).unwrap();
    assert_eq!(v.get::<f32>(), vec![0.0, 1.0, 2.0]);
    assert_eq!(i.get::<i64>(), vec![5, 2, 4]);
}

#[test]
fn sort_both_rejects_mismatched_outputs() {
    let x = f32s(&[2, 4], &[0.0; 8]);
    let mut cx = Context::new();
    let mut v = Buf::zeros(DType::F32, &[2, 2]);
    let mut i = Buf::zeros(DType::I64, &[2, 3]);
    assert!(sort_both(x.r(), 1, false, v.w(), i.w(), &mut cx).is_err());
    let mut i32s = Buf::zeros(DType::I32, &[2, 2]);
    assert!(sort_both(x.r(), 1, false, v.w(), i32s.w(), &mut cx).is_err());
    let mut i = Buf::zeros(DType::I64, &[2, 2]);
    let mut v64 = Buf::zeros(DType::F64, &[2, 2]);
    assert!(sort_both(x.r(), 1, false, v64.w(), i.w(), &mut cx).is_err());
    let mut big_v = Buf::zeros(DType::F32, &[2, 5]);
    let mut big_i = Buf::zeros(DType::I64, &[2, 5]);
    assert!(sort_both(x.r(), 1, false, big_v.w(), big_i.w(), &mut cx).is_err());
}

/// Pooling geometry of one case: kernel, stride, padding, dilation, output.
struct PoolCase {
    input: Vec<usize>,
    kernel: Vec<usize>,
    stride: Vec<usize>,
    padding: Vec<usize>,
    dilation: Vec<usize>,
    output: Vec<usize>,
}

fn pool_case(
    input: &[usize],
    kernel: &[usize],
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    ceil: bool,
) -> PoolCase {
    let nk = kernel.len();
    let mut output = input.to_vec();
    for i in 0..nk {
        let d = input.len() - nk + i;
        let span = dilation[i] * (kernel[i] - 1) + 1;
        let room = input[d] + 2 * padding[i] - span;
        let mut o = if ceil { room.div_ceil(stride[i]) } else { room / stride[i] } + 1;
        // torch: the last window must start inside the input or left padding.
        if ceil && (o - 1) * stride[i] >= input[d] + padding[i] {
            o -= 1;
        }
        output[d] = o;
    }
    PoolCase {
        input: input.to_vec(),
        kernel: kernel.to_vec(),
        stride: stride.to_vec(),
        padding: padding.to_vec(),
        dilation: dilation.to_vec(),
        output,
    }
}

#[test]
fn max_pool_with_indices_matches_two_pools() {
    let cases = [
        // Plain 2-d windows (pool(Max) takes its fast path there).
        pool_case(&[2, 3, 8, 8], &[2, 2], &[2, 2], &[0, 0], &[1, 1], false),
        pool_case(&[1, 2, 7, 9], &[3, 3], &[2, 2], &[0, 0], &[1, 1], false),
        // Padding, dilation, ceil mode; 1-d and 3-d.
        pool_case(&[1, 2, 7, 9], &[3, 3], &[2, 2], &[1, 1], &[1, 1], true),
        pool_case(&[2, 1, 9, 6], &[3, 2], &[1, 2], &[1, 0], &[2, 1], false),
        pool_case(&[3, 17], &[3], &[2], &[1], &[1], true),
        pool_case(&[1, 1, 4, 5, 6], &[2, 2, 3], &[1, 2, 2], &[1, 1, 1], &[1, 1, 2], true),
        pool_case(&[1, 1, 3, 3], &[3, 3], &[1, 1], &[1, 1], &[1, 1], false),
    ];
    let mut r = rng(72);
    for c in &cases {
        let p = PoolParams {
            kernel: &c.kernel,
            stride: &c.stride,
            padding: &c.padding,
            dilation: &c.dilation,
            count_include_pad: false,
            divisor: None,
        };
        let n: usize = c.input.iter().product();
        let v = tricky_f64(&mut r, n);
        let all_neg_inf = vec![f64::NEG_INFINITY; n];
        for data in [&v, &all_neg_inf] {
            for dtype in [DType::F32, DType::F64] {
                let x = match dtype {
                    DType::F32 => Buf::from(dtype, &c.input, &data.iter().map(|&x| x as f32).collect::<Vec<_>>()),
                    _ => Buf::from(dtype, &c.input, data),
                };
                let mut vals = Buf::zeros(dtype, &c.output);
                let mut idx = Buf::zeros(DType::I64, &c.output);
                pool(PoolKind::Max, x.r(), &p, vals.w()).unwrap();
                pool(PoolKind::ArgMax, x.r(), &p, idx.w()).unwrap();
                let mut both_v = Buf::zeros(dtype, &c.output);
                let mut both_i = Buf::zeros(DType::I64, &c.output);
                max_pool_with_indices(x.r(), &p, both_v.w(), both_i.w()).unwrap();
                let ctx = format!("{dtype:?} {:?} kernel {:?}", c.input, c.kernel);
                assert!(same_bits(&both_v.get::<u8>(), &vals.get::<u8>()), "values differ: {ctx}");
                assert_eq!(both_i.get::<i64>(), idx.get::<i64>(), "indices differ: {ctx}");
            }
        }
    }
}

#[test]
fn max_pool_with_indices_rejects_bad_outputs() {
    let x = f32s(&[1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
    let p = PoolParams {
        kernel: &[2],
        stride: &[2],
        padding: &[0],
        dilation: &[1],
        count_include_pad: false,
        divisor: None,
    };
    let mut v = Buf::zeros(DType::F32, &[1, 1, 2]);
    let mut i = Buf::zeros(DType::I64, &[1, 1, 2]);
    max_pool_with_indices(x.r(), &p, v.w(), i.w()).unwrap();
    assert_eq!((v.get::<f32>(), i.get::<i64>()), (vec![2.0, 4.0], vec![1, 3]));
    let mut i3 = Buf::zeros(DType::I64, &[1, 1, 3]);
    assert!(max_pool_with_indices(x.r(), &p, v.w(), i3.w()).is_err());
    let mut wrong = Buf::zeros(DType::F32, &[1, 1, 2]);
    assert!(max_pool_with_indices(x.r(), &p, v.w(), wrong.w()).is_err());
    let with_divisor = PoolParams { divisor: Some(2), ..p };
    assert!(max_pool_with_indices(x.r(), &with_divisor, v.w(), i.w()).is_err());
    let xi = Buf::from(DType::I32, &[1, 1, 4], &[1i32, 2, 3, 4]);
    let mut vi = Buf::zeros(DType::I32, &[1, 1, 2]);
    assert!(max_pool_with_indices(xi.r(), &p, vi.w(), i.w()).is_err());
}
