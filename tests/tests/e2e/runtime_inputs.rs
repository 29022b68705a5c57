//! The runtime checks inputs against the declared dtypes and each dimension's
//! bounds, and accepts every size in range without recompiling.

use kiln_runtime::{DType, Error, Program, Tensor};
use kiln_tests::{fixture_dir, load_fixture};

fn program(name: &str, flavour: &str) -> std::sync::Arc<Program> {
    load_fixture(name, flavour)
}

#[test]
fn dynamic_batch_accepts_every_size_in_range_and_rejects_the_rest() {
    let p = program("dynamic_mlp", "aten");
    let inputs = p.inputs();
    assert_eq!(inputs.len(), 1);
    let (min, max) = (p.plan().symbols[0].min as usize, p.plan().symbols[0].max as usize);
    assert_eq!((min, max), (1, 64), "bounds from torch.export.Dim(min=1, max=64)");
    let mut s = p.session().unwrap();
    for batch in [1, 2, 17, 64] {
        let x = Tensor::from_f32(&[batch, 16], &vec![0.5; batch * 16]);
        let out = s.run(&[x.view()]).unwrap_or_else(|e| panic!("batch {batch}: {e}"));
        assert_eq!(out.get(0).shape[0], batch);
        // Softmax rows sum to one whatever the batch size.
        let row: f32 = out.get(0).data[..4 * out.get(0).shape[1]]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .sum();
        assert!((row - 1.0).abs() < 1e-5, "batch {batch}: softmax row sums to {row}");
    }
    for batch in [0, 65, 1000] {
        let x = Tensor::from_f32(&[batch, 16], &vec![0.5; batch * 16]);
        let err = s.run(&[x.view()]).err().unwrap_or_else(|| panic!("batch {batch} accepted"));
        assert!(
            matches!(err, Error::Input { .. }) && err.to_string().contains("outside the range [1, 64]"),
            "batch {batch}: {err}"
        );
    }
}

#[test]
fn wrong_dtype_rank_and_static_dims_are_rejected() {
    let p = program("mlp", "training");
    let mut s = p.session().unwrap();
    let wrong_dtype = Tensor { dtype: DType::F64, shape: vec![4, 16], data: vec![0; 4 * 16 * 8] };
    assert!(s.run(&[wrong_dtype.view()]).unwrap_err().to_string().contains("dtype is f64, expected f32"));
    let wrong_rank = Tensor::from_f32(&[64], &[0.0; 64]);
    assert!(s.run(&[wrong_rank.view()]).unwrap_err().to_string().contains("rank is 1"));
    let wrong_dim = Tensor::from_f32(&[4, 15], &[0.0; 60]);
    assert!(s.run(&[wrong_dim.view()]).unwrap_err().to_string().contains("expected [4, 16]"));
    let lying_data = Tensor { dtype: DType::F32, shape: vec![4, 16], data: vec![0; 10] };
    assert!(s.run(&[lying_data.view()]).is_err());
    assert!(s.run(&[]).unwrap_err().to_string().contains("expected 1 inputs"));
}

#[test]
fn one_program_many_threads() {
    let p = program("mlp", "aten");
    let x = kiln_compiler::npy::read_npy(&fixture_dir("mlp").join("input_0.npy")).unwrap();
    let reference = p.session().unwrap().run(&[x.view()]).unwrap().to_tensors();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let mut s = p.session().unwrap();
                for _ in 0..5 {
                    assert_eq!(s.run(&[x.view()]).unwrap().to_tensors(), reference);
                }
            });
        }
    });
}
