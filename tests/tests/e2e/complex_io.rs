//! Complex program inputs and outputs: complex64/complex128 tensors cross
//! the boundary as the bytes of their (real, imaginary) pairs, and the
//! complex ops between them (and a complex buffer) match eager PyTorch.
//! Fixture:
//! `tests/fixtures/generate_extras.py complex_io`.

use kiln_runtime::{DType, Error, Tensor};
use kiln_tests::{assert_outputs_close, fixture_dir, load_fixture, read_numbered, run_session, FLAVOURS};

/// The complex outputs of `ComplexIO.forward`, in order.
const OUTPUT_DTYPES: [DType; 15] = [
    DType::C64,  // mixed arithmetic
    DType::F32,  // abs + real - imag + angle
    DType::C64,  // z @ w
    DType::C64,  // fft
    DType::C64,  // ifft
    DType::C64,  // rfft of a real input
    DType::F32,  // irfft
    DType::F32,  // view_as_real
    DType::C64,  // view_as_complex + z
    DType::C128, // complex128 fft and product
    DType::C64,  // z itself
    DType::F32,  // rotary embedding by the complex buffer freqs_cis
    DType::C64,  // the buffer itself
    DType::C64,  // exp(1j * x) + exp(u)
    DType::C64,  // z * (2 - 1j) + 1j
];

#[test]
fn complex_programs_match_eager_in_both_flavours() {
    let dir = fixture_dir("complex_io");
    for flavour in FLAVOURS {
        let program = load_fixture("complex_io", flavour);
        let inputs: Vec<(DType, Vec<String>)> = program.inputs().into_iter().map(|io| (io.dtype, io.shape)).collect();
        let dims = |d: &[&str]| d.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            inputs,
            vec![
                (DType::C64, dims(&["3", "4"])),
                (DType::C64, dims(&["3", "4"])),
                (DType::C64, dims(&["4", "5"])),
                (DType::F32, dims(&["3", "8"])),
                (DType::C128, dims(&["2", "3"])),
            ],
            "{flavour}: inputs as the caller sees them"
        );
        let outputs: Vec<DType> = program.outputs().iter().map(|io| io.dtype).collect();
        assert_eq!(outputs, OUTPUT_DTYPES, "{flavour}: output dtypes");
        let mut session = program.session().expect("session");
        for case in ["case0", "case1"] {
            let want = read_numbered(&dir, &format!("{case}_output"));
            assert_eq!(want[0].dtype, DType::C64, "the fixture's npy is <c8");
            let got = run_session(&mut session, &read_numbered(&dir, &format!("{case}_input"))).expect("run");
            assert_outputs_close(&format!("complex_io/{flavour} {case}"), &got, &want, 1e-4, 1e-5);
        }
    }
}

/// The caller's complex tensor and the program's pairs are the same bytes:
/// the identity output returns the input bit for bit, and writes back as a
/// `<c8` file that numpy reads as the same array.
#[test]
fn complex_values_cross_the_boundary_unchanged() {
    let dir = fixture_dir("complex_io");
    let program = load_fixture("complex_io", "training");
    let mut session = program.session().expect("session");
    let inputs = read_numbered(&dir, "case1_input");
    let got = run_session(&mut session, &inputs).expect("run");
    assert_eq!(got[10], inputs[0], "z returned unchanged");
    let npy = kiln_compiler::npy::encode_npy(&got[10].view());
    assert!(String::from_utf8_lossy(&npy[..64]).contains("'descr': '<c8'"));
    assert_eq!(npy, std::fs::read(dir.join("case1_input_0.npy")).expect("fixture"), "byte-identical to numpy's file");
}

#[test]
fn complex_dtype_and_shape_mismatches_are_clear_input_errors() {
    let dir = fixture_dir("complex_io");
    let program = load_fixture("complex_io", "aten");
    let mut session = program.session().expect("session");
    let good = read_numbered(&dir, "case0_input");
    let run_with = |session: &mut kiln_runtime::Session, k: usize, t: Tensor| {
        let mut inputs = good.clone();
        inputs[k] = t;
        run_session(session, &inputs).expect_err("mismatched input accepted")
    };
    let z = &good[0];
    // The program's own view of z (f32 pairs) is not what the caller passes.
    let pairs = Tensor { dtype: DType::F32, shape: vec![3, 4, 2], data: z.data.clone() };
    let wide = Tensor { dtype: DType::C128, shape: vec![3, 4], data: [z.data.clone(), z.data.clone()].concat() };
    let narrow = Tensor { dtype: DType::C64, shape: vec![2, 3], data: good[4].data[..48].to_vec() };
    let short = Tensor { dtype: DType::C64, shape: vec![3, 3], data: z.data[..72].to_vec() };
    let cases = [
        (0, pairs, "dtype is f32, expected c64"),
        (0, wide, "dtype is c128, expected c64"),
        (4, narrow, "dtype is c64, expected c128"),
        (0, short, "shape is [3, 3], expected [3, 4]"),
    ];
    for (k, t, message) in cases {
        let err = run_with(&mut session, k, t);
        assert!(matches!(err, Error::Input { index, .. } if index == k), "{err}");
        assert!(err.to_string().contains(message), "{err}");
    }
    // A byte count that is not whole complex elements.
    let ragged = Tensor { dtype: DType::C64, shape: vec![3, 4], data: z.data[..92].to_vec() };
    assert!(run_with(&mut session, 0, ragged).to_string().contains("data bytes do not match shape"));
    // The session is still good.
    run_session(&mut session, &good).expect("run after errors");
}

/// `istft` of a complex spectrogram matches eager; a window whose
/// overlap-add envelope vanishes (all zeros) fails the run with torch's
/// NOLA condition named, instead of dividing by zero.
#[test]
fn istft_matches_eager_and_checks_the_window() {
    let dir = fixture_dir("complex_io");
    let tmp = kiln_tests::temp_path("complex_istft");
    kiln_compiler::compile_file(&dir.join("istft.pt2"), &tmp, &kiln_compiler::CompileOptions::default())
        .expect("istft compiles");
    let program = kiln_runtime::Program::load(&tmp).expect("load");
    std::fs::remove_file(&tmp).ok();
    let mut session = program.session().expect("session");
    let inputs = read_numbered(&dir, "istft_input");
    let want = read_numbered(&dir, "istft_output");
    let got = run_session(&mut session, &inputs).expect("run");
    assert_outputs_close("istft", &got, &want, 1e-5, 1e-6);
    let zeros = Tensor::from_f32(&[8], &[0.0; 8]);
    let err = run_session(&mut session, &[inputs[0].clone(), zeros]).expect_err("a zero window must fail");
    assert!(err.to_string().contains("NOLA"), "{err}");
}

/// The compile error of complex_io's program `file`, which must not compile.
fn compile_error(file: &str) -> String {
    let pt2 = fixture_dir("complex_io").join(file);
    let tmp = kiln_tests::temp_path(&format!("complex_{}", file.trim_end_matches(".pt2")));
    kiln_compiler::compile_file(&pt2, &tmp, &kiln_compiler::CompileOptions::default())
        .expect_err(&format!("complex_io/{file} must not compile"))
        .to_string()
}

/// A write into a view of a complex value whose base is read afterwards
/// would have to reach the base: refused, naming the op and the line (a
/// write nothing else sees, `zero_` of a clone, is the conformance case).
#[test]
fn complex_write_through_a_view_is_refused() {
    let err = compile_error("view_write.pt2");
    assert!(err.contains("aten.mul_.Tensor"), "{err}");
    assert!(err.contains("other views or the program's state see"), "{err}");
    assert!(err.contains("generate_extras.py:"), "{err}");
    // `view_as_real(w)` shares w's storage: a write into it must reach w.
    let err = compile_error("part_write.pt2");
    assert!(err.contains("`view_as_real` view"), "{err}");
}

/// A complex op kiln cannot lower fails the compile, naming the op and the
/// Python line.
#[test]
fn unsupported_complex_op_names_op_and_line() {
    let err = compile_error("unsupported.pt2");
    assert!(err.contains("aten.matrix_exp.default"), "{err}");
    assert!(err.contains("`matrix_exp` of complex64"), "{err}");
    assert!(err.contains("generate_extras.py:"), "{err}");
}
