//! A hand-encoded `xla.CompileOptionsProto`: kiln needs a few fields, not a
//! protobuf dependency. Field numbers are from `xla/pjrt/proto/compile_options.proto`
//! and `xla/xla_data.proto`:
//!
//! ```text
//! CompileOptionsProto          { ExecutableBuildOptionsProto executable_build_options = 3; }
//! ExecutableBuildOptionsProto  { int64 num_replicas = 4; int64 num_partitions = 5;
//!                                bool use_spmd_partitioning = 6;
//!                                DeviceAssignmentProto device_assignment = 9;
//!                                bool use_shardy_partitioner = 19; }
//! DeviceAssignmentProto        { int32 replica_count = 1; int32 computation_count = 2;
//!                                repeated ComputationDevice computation_devices = 3; }
//! ComputationDevice            { repeated int64 replica_device_ids = 1; }
//! ```

const VARINT: u64 = 0;
const LEN: u64 = 2;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u64, wire: u64) {
    varint(out, (field << 3) | wire);
}

fn int_field(out: &mut Vec<u8>, field: u64, v: i64) {
    tag(out, field, VARINT);
    // Protobuf encodes negative int64 as its two's-complement u64.
    varint(out, v as u64);
}

fn message_field(out: &mut Vec<u8>, field: u64, body: &[u8]) {
    tag(out, field, LEN);
    varint(out, body.len() as u64);
    out.extend_from_slice(body);
}

/// Options for one replica, one partition, running on the device with global
/// id `device_id` (what `PJRT_DeviceDescription_Id` reports).
pub fn single_device(device_id: i64) -> Vec<u8> {
    let mut computation_device = Vec::new();
    int_field(&mut computation_device, 1, device_id);
    let mut assignment = Vec::new();
    int_field(&mut assignment, 1, 1);
    int_field(&mut assignment, 2, 1);
    message_field(&mut assignment, 3, &computation_device);
    let mut build = Vec::new();
    int_field(&mut build, 4, 1);
    int_field(&mut build, 5, 1);
    message_field(&mut build, 9, &assignment);
    let mut options = Vec::new();
    message_field(&mut options, 3, &build);
    options
}

/// Options for an SPMD program over `device_ids.len()` partitions (one
/// replica), partition `p` on the device with global id `device_ids[p]`,
/// partitioned by XLA's SPMD partitioner, with Shardy's propagation when the
/// program carries Shardy annotations. `replica_device_ids` are not packed,
/// as in the encodings checked on the XLA CPU plugin.
pub fn spmd(device_ids: &[i64], shardy: bool) -> Vec<u8> {
    let mut assignment = Vec::new();
    int_field(&mut assignment, 1, 1);
    int_field(&mut assignment, 2, device_ids.len() as i64);
    for &id in device_ids {
        let mut computation_device = Vec::new();
        int_field(&mut computation_device, 1, id);
        message_field(&mut assignment, 3, &computation_device);
    }
    let mut build = Vec::new();
    int_field(&mut build, 4, 1);
    int_field(&mut build, 5, device_ids.len() as i64);
    int_field(&mut build, 6, 1);
    message_field(&mut build, 9, &assignment);
    if shardy {
        int_field(&mut build, 19, 1);
    }
    let mut options = Vec::new();
    message_field(&mut options, 3, &build);
    options
}

#[cfg(test)]
mod tests {
    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or(0xff)).collect()
    }

    /// The encodings that compiled and ran on the XLA CPU plugin
    /// (../shared/notes/sharding-pjrt.md, section 1).
    #[test]
    fn spmd_matches_the_checked_encodings() {
        let four = "1a1c 2001 2804 3001 4a14 0801 1004 1a020800 1a020801 1a020802 1a020803";
        assert_eq!(super::spmd(&[0, 1, 2, 3], false), hex(four));
        // Shardy adds field 19 = 1 inside the build options (whose length grows by 3).
        let shardy = "1a1f 2001 2804 3001 4a14 0801 1004 1a020800 1a020801 1a020802 1a020803 980101";
        assert_eq!(super::spmd(&[0, 1, 2, 3], true), hex(shardy));
        let two = "1a14 2001 2802 3001 4a0c 0801 1002 1a020800 1a020801";
        assert_eq!(super::spmd(&[0, 1], false), hex(two));
    }

    #[test]
    fn encodes_device_two() {
        // 1a LEN{ 20 01, 28 01, 4a LEN{ 08 01, 10 01, 1a LEN{ 08 02 } } }
        let expected = [0x1a, 0x0e, 0x20, 0x01, 0x28, 0x01, 0x4a, 0x08, 0x08, 0x01, 0x10, 0x01, 0x1a, 0x02, 0x08, 0x02];
        assert_eq!(super::single_device(2), expected);
    }

    #[test]
    fn varints_span_bytes() {
        let mut v = Vec::new();
        super::varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
    }
}
