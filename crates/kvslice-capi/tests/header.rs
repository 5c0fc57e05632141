//! `include/kvslice.h` is what cbindgen generates from the crate's source today; with
//! `KVSLICE_BLESS=1` the test writes it instead.
use std::path::Path;

#[test]
fn the_committed_header_is_the_generated_one() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).unwrap();
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_src(crate_dir.join("src/lib.rs"))
        .with_config(config)
        .generate()
        .expect("cbindgen could not read the crate")
        .write(&mut generated);
    let generated = String::from_utf8(generated).unwrap();
    let path = crate_dir.join("include/kvslice.h");
    if std::env::var_os("KVSLICE_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/kvslice.h is out of date: run `KVSLICE_BLESS=1 cargo test -p kvslice-capi --test header`"
    );
}
