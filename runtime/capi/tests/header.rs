//! `include/kiln.h` is what cbindgen generates from `src/lib.rs` today.
//! `KILN_BLESS_HEADER=1 cargo test -p kiln-capi --test header` rewrites it.

use std::path::Path;

#[test]
fn checked_in_header_is_current() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("read cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8 header");
    let path = crate_dir.join("include/kiln.h");
    if std::env::var_os("KILN_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write kiln.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/kiln.h is stale; run KILN_BLESS_HEADER=1 cargo test -p kiln-capi --test header\n--- generated ---\n{generated}"
    );
}
