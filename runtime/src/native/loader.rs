//! The runtime's own loader for ELF relocatable objects (what the compiler's
//! `native` feature emits): no system linker, no `dlopen`, no LLVM.
//!
//! An object is untrusted bytes. [`LoadedObject::load`] checks the machine,
//! lays every allocated section out in one anonymous mapping (bounds- and
//! overflow-checked), applies the few relocation kinds LLVM emits for
//! position-independent code on x86-64 and AArch64 (anything else, any
//! undefined or absolute symbol, any writable section is an error), then
//! makes the mapping read + execute — it is never writable and executable at
//! once — and flushes the instruction cache on AArch64.

use object::elf;
use object::read::elf::ElfFile64;
use object::{
    Endianness, Object, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget, SectionFlags, SectionIndex,
    SymbolSection,
};

/// The instruction sets whose objects the loader relocates.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// The instruction set this runtime was built for, if it can run native code.
    pub fn host() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }

    fn e_machine(self) -> u16 {
        match self {
            Arch::X86_64 => elf::EM_X86_64,
            Arch::Aarch64 => elf::EM_AARCH64,
        }
    }
}

/// Largest object the loader maps (a sanity bound on untrusted sizes).
const MAX_IMAGE_BYTES: u64 = 64 << 20;
/// Largest section alignment accepted.
const MAX_ALIGN: u64 = 4096;
/// Bytes of one GOT slot (an absolute 64-bit address).
const GOT_SLOT: u64 = 8;

/// An object mapped, relocated and made read + execute.
pub struct LoadedObject {
    image: Image,
    /// Defined global function symbols: name and offset into the image.
    functions: Vec<(String, usize)>,
}

impl std::fmt::Debug for LoadedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedObject").field("bytes", &self.image.len).field("functions", &self.functions).finish()
    }
}

impl LoadedObject {
    /// Parses, lays out and relocates `bytes` for `arch`. With `map` false
    /// the relocations are computed into a private buffer and never made
    /// executable (checking an object for another ISA); the result then has
    /// no callable code ([`LoadedObject::function`] returns None).
    pub fn load(bytes: &[u8], arch: Arch) -> Result<LoadedObject, String> {
        Self::load_inner(bytes, arch, arch_is_host(arch))
    }

    /// [`LoadedObject::load`] without making anything executable: checks
    /// that every section, symbol and relocation is acceptable for `arch`.
    pub fn check(bytes: &[u8], arch: Arch) -> Result<Vec<String>, String> {
        let o = Self::load_inner(bytes, arch, false)?;
        Ok(o.functions.into_iter().map(|(n, _)| n).collect())
    }

    fn load_inner(bytes: &[u8], arch: Arch, executable: bool) -> Result<LoadedObject, String> {
        // The ELF reader needs 8-byte-aligned headers: an unaligned object
        // (a slice of a larger buffer) is read from an aligned copy.
        let aligned: Vec<u64>;
        let bytes = if bytes.as_ptr().align_offset(8) == 0 {
            bytes
        } else {
            let mut words = vec![0u64; bytes.len().div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
            aligned = words;
            &bytemuck::cast_slice::<u64, u8>(&aligned)[..bytes.len()]
        };
        let file = ElfFile64::<Endianness>::parse(bytes).map_err(|e| format!("not an ELF64 object: {e}"))?;
        let header = file.elf_header();
        let endian = file.endian();
        if endian != Endianness::Little {
            return Err("big-endian object".into());
        }
        let machine = header.e_machine.get(endian);
        if machine != arch.e_machine() {
            return Err(format!("object is for ELF machine {machine}, expected {} ({arch:?})", arch.e_machine()));
        }
        if header.e_type.get(endian) != elf::ET_REL {
            return Err("not a relocatable object (ET_REL)".into());
        }
        let layout = Layout::of(&file)?;
        let mut buf = vec![0u8; layout.total];
        for &(index, (offset, size)) in &layout.sections {
            let section = file.section_by_index(index).map_err(|e| format!("section {}: {e}", index.0))?;
            if section.kind() == object::SectionKind::UninitializedData {
                continue;
            }
            let data = section.data().map_err(|e| format!("section {}: {e}", index.0))?;
            if data.len() as u64 != size {
                return Err(format!("section {}: {} bytes of data for size {size}", index.0, data.len()));
            }
            buf[offset..offset + data.len()].copy_from_slice(data);
        }
        // The final address of the image is needed for absolute and
        // PC-relative values, so the mapping exists before relocation.
        let mut image = if executable { Image::map(layout.total)? } else { Image::buffer(layout.total) };
        let base = image.addr() as u64;
        let mut got_used = 0u64;
        for &(index, (offset, size)) in &layout.sections {
            let section = file.section_by_index(index).map_err(|e| format!("section {}: {e}", index.0))?;
            for (r_offset, reloc) in section.relocations() {
                let RelocationFlags::Elf { r_type } = reloc.flags() else {
                    return Err("non-ELF relocation".into());
                };
                let width = reloc_width(arch, r_type)
                    .ok_or_else(|| format!("section {}: unsupported relocation type {r_type} ({arch:?})", index.0))?;
                if r_offset.checked_add(width).is_none_or(|end| end > size) {
                    return Err(format!("section {}: relocation at {r_offset} outside the section", index.0));
                }
                let s = symbol_address(&file, &layout, reloc.target(), base)?;
                let a = reloc.addend();
                let at = offset + r_offset as usize;
                let p = base + at as u64;
                let got = if needs_got(arch, r_type) {
                    let slot = layout.got_offset as u64 + got_used * GOT_SLOT;
                    got_used += 1;
                    if got_used > layout.got_slots as u64 {
                        return Err("GOT overflow".into());
                    }
                    buf[slot as usize..slot as usize + 8].copy_from_slice(&s.to_le_bytes());
                    base + slot
                } else {
                    0
                };
                apply(arch, r_type, &mut buf[at..at + width as usize], s, a, p, got)
                    .map_err(|e| format!("section {}: relocation at {r_offset}: {e}", index.0))?;
            }
        }
        image.fill_and_seal(&buf)?;
        let mut functions = Vec::new();
        for sym in file.symbols() {
            if sym.kind() != object::SymbolKind::Text || !sym.is_global() || sym.is_undefined() {
                continue;
            }
            let SymbolSection::Section(si) = sym.section() else { continue };
            let Some(&(offset, size)) = layout.sections.iter().find(|(i, _)| *i == si).map(|(_, v)| v) else {
                return Err("function symbol in a section that is not loaded".into());
            };
            if sym.address() >= size {
                return Err("function symbol outside its section".into());
            }
            let name = sym.name().map_err(|e| format!("symbol name: {e}"))?;
            functions.push((name.to_string(), offset + sym.address() as usize));
        }
        Ok(LoadedObject { image, functions })
    }

    /// The names of the object's defined global functions.
    pub fn function_names(&self) -> impl Iterator<Item = &str> {
        self.functions.iter().map(|(n, _)| n.as_str())
    }

    /// The address of the defined global function `name`, when the image is executable.
    pub fn function(&self, name: &str) -> Option<*const u8> {
        if !self.image.executable {
            return None;
        }
        let &(_, offset) = self.functions.iter().find(|(n, _)| n == name)?;
        Some(self.image.addr().wrapping_add(offset))
    }

    /// Bytes of the mapped image.
    pub fn image_len(&self) -> usize {
        self.image.len
    }
}

fn arch_is_host(arch: Arch) -> bool {
    Arch::host() == Some(arch)
}

/// Where each loaded section goes in the image, and the GOT at its end.
struct Layout {
    /// (section, (offset in image, size)).
    sections: Vec<(SectionIndex, (usize, u64))>,
    got_offset: usize,
    got_slots: usize,
    total: usize,
}

impl Layout {
    fn of(file: &ElfFile64<Endianness>) -> Result<Layout, String> {
        let mut sections = Vec::new();
        let mut end = 0u64;
        let mut got_slots = 0u64;
        let arch = match file.elf_header().e_machine.get(file.endian()) {
            elf::EM_AARCH64 => Arch::Aarch64,
            _ => Arch::X86_64,
        };
        for section in file.sections() {
            let SectionFlags::Elf { sh_flags } = section.flags() else { continue };
            if sh_flags & u64::from(elf::SHF_ALLOC) == 0 {
                continue;
            }
            let size = section.size();
            if sh_flags & u64::from(elf::SHF_WRITE) != 0 && size > 0 {
                let name = section.name().unwrap_or("?");
                return Err(format!("writable section {name}: native code must not keep mutable state"));
            }
            if sh_flags & u64::from(elf::SHF_TLS) != 0 && size > 0 {
                return Err("thread-local section".into());
            }
            let align = section.align().max(1);
            if align > MAX_ALIGN || !align.is_power_of_two() {
                return Err(format!("section {}: alignment {align}", section.index().0));
            }
            let offset = end.checked_next_multiple_of(align).ok_or("section offset overflows")?;
            end = offset.checked_add(size).ok_or("section size overflows")?;
            if end > MAX_IMAGE_BYTES {
                return Err(format!("object needs more than {MAX_IMAGE_BYTES} bytes"));
            }
            sections.push((section.index(), (offset as usize, size)));
        }
        for (index, _) in &sections {
            let section = file.section_by_index(*index).map_err(|e| e.to_string())?;
            for (_, reloc) in section.relocations() {
                if let RelocationFlags::Elf { r_type } = reloc.flags() {
                    if needs_got(arch, r_type) {
                        got_slots += 1;
                    }
                }
            }
        }
        let got_offset = end.checked_next_multiple_of(GOT_SLOT).ok_or("GOT offset overflows")?;
        let total = got_slots.checked_mul(GOT_SLOT).and_then(|g| g.checked_add(got_offset)).ok_or("GOT overflows")?;
        if total > MAX_IMAGE_BYTES {
            return Err(format!("object needs more than {MAX_IMAGE_BYTES} bytes"));
        }
        Ok(Layout { sections, got_offset: got_offset as usize, got_slots: got_slots as usize, total: total as usize })
    }
}

/// The final address of a relocation's symbol: a defined symbol in a loaded section.
fn symbol_address(
    file: &ElfFile64<Endianness>,
    layout: &Layout,
    target: RelocationTarget,
    base: u64,
) -> Result<u64, String> {
    let RelocationTarget::Symbol(si) = target else {
        return Err("relocation without a symbol".into());
    };
    let sym = file.symbol_by_index(si).map_err(|e| format!("relocation symbol {}: {e}", si.0))?;
    let SymbolSection::Section(section) = sym.section() else {
        let name = sym.name().unwrap_or("?");
        return Err(format!("symbol {name:?} is undefined or absolute: native code may call nothing outside itself"));
    };
    let &(offset, size) = layout
        .sections
        .iter()
        .find(|(i, _)| *i == section)
        .map(|(_, v)| v)
        .ok_or_else(|| format!("symbol {} in a section that is not loaded", si.0))?;
    if sym.address() > size {
        return Err(format!("symbol {} outside its section", si.0));
    }
    Ok(base + offset as u64 + sym.address())
}

// AArch64 relocation numbers (ELF for the Arm 64-bit Architecture).
const R_AARCH64_ABS64: u32 = 257;
const R_AARCH64_PREL64: u32 = 260;
const R_AARCH64_PREL32: u32 = 261;
const R_AARCH64_ADR_PREL_PG_HI21: u32 = 275;
const R_AARCH64_ADD_ABS_LO12_NC: u32 = 277;
const R_AARCH64_LDST8_ABS_LO12_NC: u32 = 278;
const R_AARCH64_JUMP26: u32 = 282;
const R_AARCH64_CALL26: u32 = 283;
const R_AARCH64_LDST16_ABS_LO12_NC: u32 = 284;
const R_AARCH64_LDST32_ABS_LO12_NC: u32 = 285;
const R_AARCH64_LDST64_ABS_LO12_NC: u32 = 286;
const R_AARCH64_LDST128_ABS_LO12_NC: u32 = 299;

/// Bytes a supported relocation patches; None for any other kind.
fn reloc_width(arch: Arch, r_type: u32) -> Option<u64> {
    match arch {
        Arch::X86_64 => match r_type {
            elf::R_X86_64_64 => Some(8),
            elf::R_X86_64_PC32
            | elf::R_X86_64_PLT32
            | elf::R_X86_64_GOTPCREL
            | elf::R_X86_64_GOTPCRELX
            | elf::R_X86_64_REX_GOTPCRELX => Some(4),
            _ => None,
        },
        Arch::Aarch64 => match r_type {
            R_AARCH64_ABS64 | R_AARCH64_PREL64 => Some(8),
            R_AARCH64_PREL32
            | R_AARCH64_ADR_PREL_PG_HI21
            | R_AARCH64_ADD_ABS_LO12_NC
            | R_AARCH64_LDST8_ABS_LO12_NC
            | R_AARCH64_LDST16_ABS_LO12_NC
            | R_AARCH64_LDST32_ABS_LO12_NC
            | R_AARCH64_LDST64_ABS_LO12_NC
            | R_AARCH64_LDST128_ABS_LO12_NC
            | R_AARCH64_JUMP26
            | R_AARCH64_CALL26 => Some(4),
            _ => None,
        },
    }
}

fn needs_got(arch: Arch, r_type: u32) -> bool {
    arch == Arch::X86_64
        && matches!(r_type, elf::R_X86_64_GOTPCREL | elf::R_X86_64_GOTPCRELX | elf::R_X86_64_REX_GOTPCRELX)
}

fn put_i32(at: &mut [u8], v: i64) -> Result<(), String> {
    let v = i32::try_from(v).map_err(|_| format!("value {v} does not fit 32 signed bits"))?;
    at.copy_from_slice(&v.to_le_bytes());
    Ok(())
}

fn patch_insn(at: &mut [u8], f: impl FnOnce(u32) -> u32) {
    let insn = u32::from_le_bytes([at[0], at[1], at[2], at[3]]);
    at.copy_from_slice(&f(insn).to_le_bytes());
}

/// Writes relocation `r_type` at `at`: symbol `s`, addend `a`, place `p`,
/// the symbol's GOT slot `got` (x86-64 GOT kinds only).
fn apply(arch: Arch, r_type: u32, at: &mut [u8], s: u64, a: i64, p: u64, got: u64) -> Result<(), String> {
    let sa = s.wrapping_add(a as u64);
    let rel = sa.wrapping_sub(p) as i64;
    match (arch, r_type) {
        (Arch::X86_64, elf::R_X86_64_64) | (Arch::Aarch64, R_AARCH64_ABS64) => at.copy_from_slice(&sa.to_le_bytes()),
        (Arch::X86_64, elf::R_X86_64_PC32 | elf::R_X86_64_PLT32) | (Arch::Aarch64, R_AARCH64_PREL32) => {
            put_i32(at, rel)?
        }
        (Arch::X86_64, _) => put_i32(at, got.wrapping_add(a as u64).wrapping_sub(p) as i64)?,
        (Arch::Aarch64, R_AARCH64_PREL64) => at.copy_from_slice(&(rel as u64).to_le_bytes()),
        (Arch::Aarch64, R_AARCH64_JUMP26 | R_AARCH64_CALL26) => {
            if rel & 3 != 0 || !(-(1i64 << 27)..(1i64 << 27)).contains(&rel) {
                return Err(format!("branch offset {rel} out of range"));
            }
            patch_insn(at, |i| (i & 0xfc00_0000) | ((rel >> 2) as u32 & 0x03ff_ffff));
        }
        (Arch::Aarch64, R_AARCH64_ADR_PREL_PG_HI21) => {
            let pages = ((sa & !0xfff) as i64).wrapping_sub((p & !0xfff) as i64) >> 12;
            if !(-(1i64 << 20)..(1i64 << 20)).contains(&pages) {
                return Err(format!("page offset {pages} out of range"));
            }
            let imm = pages as u32;
            patch_insn(at, |i| (i & 0x9f00_001f) | ((imm & 3) << 29) | (((imm >> 2) & 0x7_ffff) << 5));
        }
        (Arch::Aarch64, _) => {
            let shift = match r_type {
                R_AARCH64_ADD_ABS_LO12_NC | R_AARCH64_LDST8_ABS_LO12_NC => 0,
                R_AARCH64_LDST16_ABS_LO12_NC => 1,
                R_AARCH64_LDST32_ABS_LO12_NC => 2,
                R_AARCH64_LDST64_ABS_LO12_NC => 3,
                _ => 4,
            };
            let lo = sa & 0xfff;
            if lo & ((1 << shift) - 1) != 0 {
                return Err(format!("low 12 bits {lo:#x} not aligned to {} bytes", 1 << shift));
            }
            patch_insn(at, |i| (i & !(0xfff << 10)) | (((lo >> shift) as u32) << 10));
        }
    }
    Ok(())
}

/// The image's memory: an anonymous mapping (executable once sealed) or,
/// for checking another ISA's object, a plain buffer.
struct Image {
    ptr: *mut u8,
    len: usize,
    mapped: usize,
    executable: bool,
    buffer: Vec<u8>,
}

// SAFETY: after `fill_and_seal` the image is immutable read + execute
// memory owned by this value.
unsafe impl Send for Image {}
unsafe impl Sync for Image {}

impl Image {
    fn buffer(len: usize) -> Image {
        let mut buffer = vec![0u8; len.max(1)];
        Image { ptr: buffer.as_mut_ptr(), len, mapped: 0, executable: false, buffer }
    }

    fn map(len: usize) -> Result<Image, String> {
        let mapped = len.max(1).next_multiple_of(page_size());
        // SAFETY: an anonymous private mapping; no file, no fixed address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!("mmap of {mapped} bytes failed: {}", std::io::Error::last_os_error()));
        }
        Ok(Image { ptr: ptr.cast(), len, mapped, executable: false, buffer: Vec::new() })
    }

    fn addr(&self) -> *const u8 {
        self.ptr
    }

    /// Copies the relocated bytes in and, for a mapping, makes it read + execute.
    fn fill_and_seal(&mut self, bytes: &[u8]) -> Result<(), String> {
        if self.mapped == 0 {
            self.buffer[..bytes.len()].copy_from_slice(bytes);
            return Ok(());
        }
        // SAFETY: the mapping is writable and `mapped >= len == bytes.len()`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr, bytes.len()) };
        // SAFETY: our own mapping; from here on it is never writable.
        let rc = unsafe { libc::mprotect(self.ptr.cast(), self.mapped, libc::PROT_READ | libc::PROT_EXEC) };
        if rc != 0 {
            return Err(format!("mprotect to read+exec failed: {}", std::io::Error::last_os_error()));
        }
        flush_icache(self.ptr, self.len);
        self.executable = true;
        Ok(())
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        if self.mapped != 0 {
            // SAFETY: our own mapping of `mapped` bytes, unused past this point.
            unsafe { libc::munmap(self.ptr.cast(), self.mapped) };
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Makes freshly written code visible to instruction fetch: a no-op on
/// x86-64 (coherent caches); on AArch64 clean the data cache to the point of
/// unification and invalidate the instruction cache, line by line.
#[allow(unused_variables)]
fn flush_icache(ptr: *const u8, len: usize) {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: cache maintenance on our own readable mapping.
    unsafe {
        let ctr: u64;
        std::arch::asm!("mrs {}, ctr_el0", out(reg) ctr);
        let dline = 4usize << ((ctr >> 16) & 0xf);
        let iline = 4usize << (ctr & 0xf);
        let (start, end) = (ptr as usize, ptr as usize + len);
        let mut a = start & !(dline - 1);
        while a < end {
            std::arch::asm!("dc cvau, {}", in(reg) a);
            a += dline;
        }
        std::arch::asm!("dsb ish");
        let mut a = start & !(iline - 1);
        while a < end {
            std::arch::asm!("ic ivau, {}", in(reg) a);
            a += iline;
        }
        std::arch::asm!("dsb ish", "isb");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insn(word: u32) -> [u8; 4] {
        word.to_le_bytes()
    }

    fn patched(r_type: u32, word: u32, s: u64, p: u64) -> Result<u32, String> {
        let mut at = insn(word);
        apply(Arch::Aarch64, r_type, &mut at, s, 0, p, 0)?;
        Ok(u32::from_le_bytes(at))
    }

    #[test]
    fn aarch64_instruction_fields_are_patched() {
        // bl +8
        assert_eq!(patched(R_AARCH64_CALL26, 0x9400_0000, 0x1008, 0x1000), Ok(0x9400_0002));
        // b -4
        assert_eq!(patched(R_AARCH64_JUMP26, 0x1400_0000, 0x0ffc, 0x1000), Ok(0x17ff_ffff));
        // adrp x0, +1 page
        assert_eq!(patched(R_AARCH64_ADR_PREL_PG_HI21, 0x9000_0000, 0x2123, 0x1ff0), Ok(0xb000_0000));
        // add x0, x0, #0x123
        assert_eq!(patched(R_AARCH64_ADD_ABS_LO12_NC, 0x9100_0000, 0x2123, 0), Ok(0x9104_8c00));
        // ldr w0, [x0, #0x124]; ldr q0, [x0, #0x120]
        assert_eq!(patched(R_AARCH64_LDST32_ABS_LO12_NC, 0xb940_0000, 0x2124, 0), Ok(0xb941_2400));
        assert_eq!(patched(R_AARCH64_LDST128_ABS_LO12_NC, 0x3dc0_0000, 0x2120, 0), Ok(0x3dc0_4800));
        // Misaligned low bits and out-of-range branches are errors.
        assert!(patched(R_AARCH64_LDST64_ABS_LO12_NC, 0xf940_0000, 0x2124, 0).is_err());
        assert!(patched(R_AARCH64_CALL26, 0x9400_0000, 1 << 28, 0).is_err());
        assert!(patched(R_AARCH64_CALL26, 0x9400_0000, 6, 0).is_err());
    }

    #[test]
    fn x86_64_values_are_range_checked() {
        let mut at = [0u8; 4];
        apply(Arch::X86_64, elf::R_X86_64_PC32, &mut at, 0x2000, -4, 0x1000, 0).unwrap();
        assert_eq!(i32::from_le_bytes(at), 0xffc);
        assert!(apply(Arch::X86_64, elf::R_X86_64_PC32, &mut at, 1 << 40, 0, 0, 0).is_err());
        let mut wide = [0u8; 8];
        apply(Arch::X86_64, elf::R_X86_64_64, &mut wide, 0x1234, 8, 0, 0).unwrap();
        assert_eq!(u64::from_le_bytes(wide), 0x123c);
        assert_eq!(reloc_width(Arch::X86_64, elf::R_X86_64_32), None);
        assert_eq!(reloc_width(Arch::Aarch64, 1024), None);
    }
}
