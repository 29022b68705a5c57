//! A hand-encoded `xla.CompileOptionsProto`: kiln needs three fields, not a
//! protobuf dependency. Field numbers are from `xla/pjrt/proto/compile_options.proto`
//! and `xla/xla_data.proto`:
//!
//! ```text
//! CompileOptionsProto          { ExecutableBuildOptionsProto executable_build_options = 3; }
//! ExecutableBuildOptionsProto  { int64 num_replicas = 4; int64 num_partitions = 5;
//!                                DeviceAssignmentProto device_assignment = 9; }
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

#[cfg(test)]
mod tests {
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
