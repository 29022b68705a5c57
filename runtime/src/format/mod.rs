//! The `.kiln` file format.
//!
//! ```text
//! offset 0   FileHeader (48 bytes)
//!            SectionEntry × section_count (32 bytes each)
//!            sections, each starting at a multiple of SECTION_ALIGN
//! ```
//! All integers are little-endian. Every section carries a CRC-32 of its bytes.
//! The plan section is a `postcard`-encoded [`Plan`]; the weights section holds
//! raw tensors, each at a multiple of [`WEIGHT_ALIGN`] from the section start, so
//! the runtime uses them in place from the memory map.
//!
//! Compatibility: a reader accepts files whose major version equals its own and
//! whose minor version is not newer. Unknown sections flagged
//! [`SECTION_FLAG_OPTIONAL`] are skipped (room for StableHLO text, native code,
//! quantization tables, shardings); unknown required sections are an error.

pub mod plan;
mod read;
mod write;

pub use plan::*;
pub use read::{parse_container, Container};
#[cfg(feature = "fs")]
pub use write::write_file_atomic;
pub use write::{ArtifactWriter, WeightsBuilder};

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

pub const MAGIC: [u8; 8] = *b"KILNART\0";
pub const FORMAT_MAJOR: u16 = 0;
/// Before 1.0 every minor version may change the plan's encoding (0.2 added
/// pooling divisors and indices, data-dependent sizes and loops; 0.3 numbered
/// the opcodes and leaf enums, split instruction kinds and allowed several
/// outputs per call; 0.4 added session state, the fused elementwise, RMS
/// norm and grouped matmul opcodes and erfc; 0.5 conv/linear epilogues,
/// quantized linear layers, scans, linalg, run-time asserts, special
/// functions, and the SPMD mesh and shardings of accelerator segments; 0.6
/// the native-code section and instruction and static activation
/// parameters; 0.7 shape buckets and host-side index checks of accelerator
/// segments, new special-function selectors; 0.8 per-row asymmetric
/// activations on `quant_linear`; 0.9 the layout of `conv_fused`, the
/// compiler's estimate of a sharded plan; 0.10 `quant_conv`; 0.11 the
/// layout of `pool`; 0.12 complex inputs and outputs, `IoDecl::complex`;
/// 0.13 the `native_kernel` instruction and row functions in the native
/// section; 0.14 int8 activations between layers on `quant_conv`
/// (`out_scale` / `out_zero_point`); 0.15 a `native_kernel`'s elementwise
/// prologue and a row function's prologue count; 0.16 the `complex` flag of
/// `linalg`; 0.17 the `mul_sigmoid` and `hardswish` epilogue activations;
/// 0.18 int8 residuals on `quant_conv`, `res_scale` / `res_zero_point`;
/// 0.19 a shape bucket's true-size arguments, `AccelBucket::true_sizes`,
/// and several outputs of `linear_fused`, column ranges of one GEMM;
/// 0.20 the `gelu_tanh_chain` epilogue activation, GPT-2's `gelu_new`, and
/// a `native_kernel`'s elementwise epilogue and a row function's epilogue
/// count; 0.21 `NativeFunction::can_fail`, elementwise functions with an
/// integer division returning whether a divisor was zero),
/// so a runtime reads exactly its own minor version; from 1.0 on,
/// minors only add. `tests/golden/` holds one artifact per version.
pub const FORMAT_MINOR: u16 = 21;
/// The oldest minor version this runtime reads.
pub const FORMAT_MINOR_MIN: u16 = if FORMAT_MAJOR == 0 { FORMAT_MINOR } else { 0 };
/// Sections start at multiples of this (a cache line; also enough for any dtype).
pub const SECTION_ALIGN: u64 = 64;
/// Each weight tensor starts at a multiple of this inside the weights section.
pub const WEIGHT_ALIGN: u64 = 64;

/// Section kinds.
pub const SECTION_PLAN: u32 = 1;
pub const SECTION_WEIGHTS: u32 = 2;
pub const SECTION_METADATA: u32 = 3;
/// Accelerator segments ([`AccelProgram`], postcard).
pub const SECTION_ACCEL: u32 = 4;
/// Generated machine code per ISA level (`crate::native::NativeSection`,
/// postcard); required: the plan's native calls name its functions.
pub const SECTION_NATIVE: u32 = 5;

/// A reader that does not know this section may skip it.
pub const SECTION_FLAG_OPTIONAL: u32 = 1;

#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct FileHeader {
    pub magic: [u8; 8],
    pub major: U16,
    pub minor: U16,
    pub section_count: U32,
    /// Total file length, so truncation is caught before anything else.
    pub file_len: U64,
    /// CRC-32 of the section table.
    pub table_crc: U32,
    pub reserved: [u8; 20],
}

#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SectionEntry {
    pub kind: U32,
    pub flags: U32,
    pub offset: U64,
    pub len: U64,
    pub crc: U32,
    pub reserved: U32,
}

pub const HEADER_LEN: usize = std::mem::size_of::<FileHeader>();
pub const ENTRY_LEN: usize = std::mem::size_of::<SectionEntry>();

const _: () = assert!(HEADER_LEN == 48);
const _: () = assert!(ENTRY_LEN == 32);

pub fn section_name(kind: u32) -> &'static str {
    match kind {
        SECTION_PLAN => "plan",
        SECTION_WEIGHTS => "weights",
        SECTION_METADATA => "metadata",
        SECTION_ACCEL => "accel",
        SECTION_NATIVE => "native",
        _ => "unknown",
    }
}
