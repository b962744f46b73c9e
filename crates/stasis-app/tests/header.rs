//! `include/stasis.h` is what cbindgen generates from this crate today.
//! A change of the C API that was not regenerated fails here; run with
//! `STASIS_BLESS=1` to rewrite the header.

use std::path::PathBuf;

#[test]
fn checked_in_header_is_what_cbindgen_generates() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header = crate_dir.join("../../include/stasis.h");
    let cfg = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(cfg)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    if std::env::var_os("STASIS_BLESS").is_some() {
        std::fs::write(&header, &out).expect("write include/stasis.h");
    }
    let have = std::fs::read(&header).unwrap_or_default();
    assert!(
        have == out,
        "include/stasis.h is stale: run STASIS_BLESS=1 cargo test -p stasis-app --test header"
    );
    for f in [
        "stasis_init",
        "stasis_protect",
        "stasis_checkpoint_begin",
        "stasis_restart_test",
        "STASIS_NONE",
        "struct stasis_stats",
    ] {
        assert!(
            String::from_utf8_lossy(&out).contains(f),
            "{f} missing from the header"
        );
    }
}
