//! Each rule of the verifier has a module that breaks it (and only it); the
//! module the notes verified on the XLA CPU plugin passes.

use super::*;

const FOUR: Devices = Devices { replicas: 1, partitions: 4 };

/// The manual-computation module that ran correctly on 4 devices (notes E23).
const VERIFIED: &str = include_str!("manual_sdy.mlir");

const ALL_TO_ALL: &str = r#"%t = "stablehlo.all_to_all"(%x) {split_dimension = 0 : i64, concat_dimension = 1 : i64, split_count = 4 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>} : (tensor<8x16xf32>) -> tensor<2x64xf32>"#;

fn module_with(op: &str) -> String {
    format!("module {{\n  func.func @main(%x: tensor<8x16xf32>) {{\n    {op}\n  }}\n}}\n")
}

fn error(module: &str, devices: Devices) -> String {
    match verify_collectives(module, devices) {
        Ok(()) => panic!("accepted:\n{module}"),
        Err(e) => e,
    }
}

/// `VERIFIED` with `from` replaced by `to` (which must occur).
fn mutated(from: &str, to: &str) -> String {
    assert!(VERIFIED.contains(from), "`{from}` is not in the module");
    VERIFIED.replacen(from, to, 1)
}

#[test]
fn the_verified_module_and_an_all_to_all_pass() {
    assert_eq!(verify_collectives(VERIFIED, FOUR), Ok(()));
    assert_eq!(verify_collectives(&module_with(ALL_TO_ALL), FOUR), Ok(()));
    // Replica mode: collectives without channels (notes E25).
    let replicas = Devices { replicas: 4, partitions: 1 };
    let plain = r#"%p = "stablehlo.collective_permute"(%x) {source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>} : (tensor<8x16xf32>) -> tensor<8x16xf32>"#;
    assert_eq!(verify_collectives(&module_with(plain), Devices { replicas: 2, partitions: 1 }), Ok(()));
    let gather = r#"%g = "stablehlo.all_gather"(%x) {all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>} : (tensor<8x16xf32>) -> tensor<16x16xf32>"#;
    assert_eq!(verify_collectives(&module_with(gather), replicas), Ok(()));
}

#[test]
fn a_collective_without_a_channel_over_partitions_is_refused() {
    // E27: the plugin aborts at execute.
    let m = mutated(", channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids", "");
    let e = error(&m, FOUR);
    assert!(e.contains("`stablehlo.all_reduce` %y (line ") && e.contains("no channel_handle"), "{e}");
}

#[test]
fn a_permute_with_a_channel_over_replicas_is_refused() {
    // E26: the plugin aborts at execute.
    let op = r#"%p = "stablehlo.collective_permute"(%x) {source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>} : (tensor<8x16xf32>) -> tensor<8x16xf32>"#;
    let e = error(&module_with(op), Devices { replicas: 2, partitions: 1 });
    assert!(e.contains("`stablehlo.collective_permute` %p") && e.contains("cross-partition"), "{e}");
}

#[test]
fn bad_channel_handles_are_refused() {
    let m = mutated("<handle = 2, type = 1>", "<handle = 0, type = 1>");
    assert!(error(&m, FOUR).contains("`stablehlo.all_gather` %g") && error(&m, FOUR).contains("handle > 0"));
    let m = mutated("<handle = 2, type = 1>", "<handle = 2, type = 2>");
    assert!(error(&m, FOUR).contains("type = 1"));
    let m = mutated("channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, ", "");
    assert!(error(&m, FOUR).contains("use_global_device_ids needs a channel_handle"));
}

#[test]
fn global_ids_on_ops_without_them_are_refused() {
    let op = ALL_TO_ALL.replace("type = 1>}", "type = 1>, use_global_device_ids}");
    assert!(error(&module_with(&op), FOUR).contains("all_to_all takes no use_global_device_ids"));
}

#[test]
fn a_device_missing_from_the_groups_is_refused() {
    // E28 (compile error on the plugin; kiln names the op).
    let m = mutated("replica_groups = dense<[[0, 1, 2, 3]]>", "replica_groups = dense<[[0, 1, 2, 5]]>");
    let e = error(&m, FOUR);
    assert!(
        e.contains("id 5 in replica_groups is outside 0..4") && e.contains("ids [3] appear in no replica group"),
        "{e}"
    );
}

#[test]
fn a_device_twice_in_the_groups_is_refused() {
    let m = mutated("dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>", "dense<[[0, 1], [1, 3]]> : tensor<2x2xi64>");
    let e = error(&m, FOUR);
    assert!(e.contains("ids [1] appear in replica_groups more than once") && e.contains("ids [2] appear in no"), "{e}");
}

#[test]
fn groups_of_different_sizes_are_refused() {
    // Padding with -1 is how a ragged table is written.
    let m = mutated("dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>", "dense<[[0, 1, 2], [3, -1, -1]]> : tensor<2x3xi64>");
    let e = error(&m, FOUR);
    assert!(e.contains("id -1 in replica_groups is outside"), "{e}");
    let m = mutated("dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>", "dense<> : tensor<0x0xi64>");
    assert!(error(&m, FOUR).contains("replica_groups is empty"));
}

#[test]
fn groups_beyond_the_mesh_are_refused() {
    // The verified module on a 2-device mesh: ids 2 and 3 do not exist.
    let e = error(VERIFIED, Devices { replicas: 1, partitions: 2 });
    assert!(e.contains("id 2 in replica_groups is outside 0..2"), "{e}");
    assert!(e.contains("id 3 in source_target_pairs is outside 0..2"), "{e}");
}

#[test]
fn duplicate_permute_sources_and_targets_are_refused() {
    let m = mutated("[[0, 1], [1, 2], [2, 3], [3, 0]]", "[[0, 1], [0, 2], [2, 3], [3, 0]]");
    assert!(error(&m, FOUR).contains("source 0 appears twice in source_target_pairs"));
    let m = mutated("[[0, 1], [1, 2], [2, 3], [3, 0]]", "[[0, 1], [1, 1], [2, 3], [3, 0]]");
    assert!(error(&m, FOUR).contains("target 1 appears twice in source_target_pairs"));
    let m = mutated("[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>", "[[0, 1, 2]]> : tensor<1x3xi64>");
    assert!(error(&m, FOUR).contains("pair [0, 1, 2] is not [source, target]"));
}

#[test]
fn bad_reduction_bodies_are_refused() {
    let sub = mutated("%s = \"stablehlo.add\"(%a, %b)", "%s = \"stablehlo.subtract\"(%a, %b)");
    assert!(error(&sub, FOUR).contains("combines with `stablehlo.subtract`"));
    let one_arg = mutated("%s = \"stablehlo.add\"(%a, %b)", "%s = \"stablehlo.add\"(%a, %a)");
    assert!(error(&one_arg, FOUR).contains("must combine both arguments"));
    let wrong_type = mutated(
        "^bb0(%a: tensor<f32>, %b: tensor<f32>):\n        %s",
        "^bb0(%a: tensor<f64>, %b: tensor<f64>):\n        %s",
    );
    assert!(error(&wrong_type, FOUR).contains("must take two tensor<f32> arguments"));
    let returns_arg = mutated("\"stablehlo.return\"(%s)", "\"stablehlo.return\"(%a)");
    assert!(error(&returns_arg, FOUR).contains("must return `%s`"));
}

#[test]
fn an_indivisible_split_is_refused() {
    // 6 rows cannot go to 4 devices.
    let op = ALL_TO_ALL.replace("(tensor<8x16xf32>) -> tensor<2x64xf32>", "(tensor<6x16xf32>) -> tensor<1x64xf32>");
    let e = error(&module_with(&op), FOUR);
    assert!(
        e.contains("`stablehlo.all_to_all` %t")
            && e.contains("split dimension 0 of size 6 is not divisible by split_count 4"),
        "{e}"
    );
    let op = ALL_TO_ALL.replace("split_count = 4", "split_count = 2");
    assert!(error(&module_with(&op), FOUR).contains("split_count 2 differs from the group size 4"));
    let scatter = mutated("scatter_dimension = 0", "scatter_dimension = 1")
        .replace("(tensor<8x16xf32>) -> tensor<2x16xf32>", "(tensor<8x16xf32>) -> tensor<8x4xf32>");
    assert_eq!(verify_collectives(&scatter, FOUR), Ok(()));
    let odd = ALL_TO_ALL.replace("(tensor<8x16xf32>) -> tensor<2x64xf32>", "(tensor<8x6xf32>) -> tensor<2x24xf32>");
    assert_eq!(verify_collectives(&module_with(&odd), FOUR), Ok(()), "the concat dim need not divide");
}

#[test]
fn wrong_result_shapes_and_dims_are_refused() {
    let m = mutated("(tensor<16x8xf32>) -> tensor<16x32xf32>", "(tensor<16x8xf32>) -> tensor<16x16xf32>");
    assert!(error(&m, FOUR).contains("result shape [16, 16], expected [16, 32]"));
    let m = mutated("all_gather_dim = 1 : i64", "all_gather_dim = 2 : i64");
    assert!(error(&m, FOUR).contains("all_gather_dim 2 is outside the operand's 2 dims"));
    let m = mutated("scatter_dimension = 0 : i64", "scatter_dimension = 1 : i64");
    assert!(error(&m, FOUR).contains("result shape [2, 16], expected [8, 4]"));
    let op = ALL_TO_ALL.replace("-> tensor<2x64xf32>", "-> tensor<2x64xf16>");
    assert!(error(&module_with(&op), FOUR).contains("operand element type f32 but result f16"));
}

#[test]
fn unchecked_collectives_and_bad_counts_are_refused() {
    let op = r#"%b = "stablehlo.collective_broadcast"(%x) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<8x16xf32>) -> tensor<8x16xf32>"#;
    assert!(error(&module_with(op), FOUR).contains("does not check this collective"));
    assert!(verify_collectives(VERIFIED, Devices { replicas: 0, partitions: 4 }).is_err());
    let op = ALL_TO_ALL.replace(" : (tensor<8x16xf32>)", "");
    assert!(error(&module_with(&op), FOUR).contains("cannot read the op"));
}
