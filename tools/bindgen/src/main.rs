//! `kvslice-bindgen IN.wasm OUT_DIR`: the wasm-bindgen step of the browser build, as a
//! workspace binary. It is the library behind `wasm-bindgen-cli` at the release Cargo.lock pins
//! for the `wasm-bindgen` crate (the generated glue must match the macros' version), built by
//! the same `cargo` run as the tests instead of a separate `cargo install`.
//! Output: `OUT_DIR/kvslice_web.js` (an ES module for `<script type="module">`) and
//! `OUT_DIR/kvslice_web_bg.wasm`, without debug names (`KVSLICE_BINDGEN_DEBUG=1` keeps them).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, out] = args.as_slice() else {
        bail!("usage: kvslice-bindgen IN.wasm OUT_DIR");
    };
    let input = PathBuf::from(input);
    if !input.is_file() {
        bail!(
            "{}: no such file (build it with cargo build --target wasm32-unknown-unknown -p kvslice-web)",
            input.display()
        );
    }
    let keep_debug = std::env::var("KVSLICE_BINDGEN_DEBUG").is_ok_and(|v| v == "1");
    let mut bindgen = wasm_bindgen_cli_support::Bindgen::new();
    bindgen
        .input_path(&input)
        .web(true)?
        .out_name("kvslice_web")
        // `init()` with no argument loads `kvslice_web_bg.wasm` beside the module (the CLI's default).
        .omit_default_module_path(false)
        .typescript(false)
        .debug(keep_debug)
        .keep_debug(keep_debug)
        .remove_name_section(!keep_debug)
        .remove_producers_section(true);
    std::fs::create_dir_all(out).with_context(|| format!("creating {out}"))?;
    bindgen.generate(out).with_context(|| format!("wasm-bindgen on {}", input.display()))?;
    Ok(())
}
