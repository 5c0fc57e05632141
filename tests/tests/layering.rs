//! The crate boundaries of docs/ARCHITECTURE.md, read from every member's manifest: a
//! dependency that crosses a boundary fails here, not in review.

use std::collections::BTreeMap;
use std::path::Path;

/// Each library crate and the kvslice crates it may depend on (normal dependencies, every
/// target).
const ALLOWED: &[(&str, &[&str])] = &[
    ("kvslice-policy", &[]),
    ("kvslice-formats", &[]),
    ("kvslice-kernels", &[]),
    ("kvslice-cache", &["kvslice-kernels"]),
    ("kvslice-model", &["kvslice-cache", "kvslice-formats", "kvslice-kernels"]),
    ("kvslice-runtime", &["kvslice-cache", "kvslice-formats", "kvslice-kernels", "kvslice-model", "kvslice-policy"]),
    ("kvslice-eval", &["kvslice-formats"]),
    // front ends: the runtime, and the formats for I/O only
    ("kvslice-cli", &["kvslice-eval", "kvslice-runtime", "kvslice-server"]),
    ("kvslice-server", &["kvslice-runtime"]),
    ("kvslice-capi", &["kvslice-runtime"]),
    ("kvslice-web", &["kvslice-formats", "kvslice-runtime"]),
    ("kvslice-example-embed", &["kvslice-runtime"]),
    // fuzz targets: the parsers of outside data, none of the crates that build burn
    ("kvslice-fuzz", &["kvslice-eval", "kvslice-formats", "kvslice-policy"]),
];

/// The `kvslice-*` normal dependencies of a manifest, any target (dev-dependencies excluded).
fn kvslice_dependencies(manifest: &str) -> (String, Vec<String>) {
    let mut name = String::new();
    let mut deps = Vec::new();
    let mut section = String::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        if section == "[package]"
            && let Some(v) = line.strip_prefix("name = ")
        {
            name = v.trim_matches('"').to_string();
        }
        let normal = section.ends_with("dependencies]") && !section.contains("dev-dependencies");
        if normal && line.starts_with("kvslice-") {
            deps.push(line.split(['.', ' ', '=']).next().unwrap_or_default().to_string());
        }
    }
    deps.sort();
    (name, deps)
}

#[test]
fn crates_depend_only_on_what_their_layer_allows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut seen = BTreeMap::new();
    for dir in ["crates", "examples"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let manifest = entry.unwrap().path().join("Cargo.toml");
            if let Ok(text) = std::fs::read_to_string(&manifest) {
                let (name, deps) = kvslice_dependencies(&text);
                seen.insert(name, deps);
            }
        }
    }
    for (name, allowed) in ALLOWED {
        let deps = seen.remove(*name).unwrap_or_else(|| panic!("{name} not found"));
        for d in &deps {
            assert!(allowed.contains(&d.as_str()), "{name} depends on {d}; its layer allows {allowed:?}");
        }
    }
    assert!(seen.is_empty(), "crates missing from the layering table: {:?}", seen.keys());
}

#[test]
fn the_manifest_reader_sees_target_specific_sections_and_skips_dev_ones() {
    let manifest = "[package]\nname = \"x\"\n[dependencies]\nkvslice-cache.workspace = true\nserde = \"1\"\n\
                    [target.'cfg(unix)'.dependencies]\nkvslice-model = { workspace = true }\n\
                    [dev-dependencies]\nkvslice-policy.workspace = true\n";
    assert_eq!(kvslice_dependencies(manifest), ("x".to_string(), vec!["kvslice-cache".into(), "kvslice-model".into()]));
}
