//! Every entry point of every shader validates with naga and translates to SPIR-V, MSL, HLSL
//! and GLSL; the rendered workgroup sizes are the ones the dispatch arithmetic uses.

use kvslice_kernels::shader::{self, Family};

#[test]
fn every_entry_point_validates_and_translates() {
    let reports = shader::check_all().unwrap_or_else(|e| panic!("{e}"));
    let expected: usize = Family::ALL.iter().map(|f| f.entries().len() * f.variants().len()).sum();
    assert_eq!(reports.len(), expected);
    for r in &reports {
        let t = &r.translations;
        assert!(t.spirv_words > 5, "{r:?}");
        assert!(t.msl_chars > 0 && t.hlsl_chars > 0 && t.glsl_chars > 0, "{r:?}");
    }
}

#[test]
fn rendered_entry_point_is_main_with_the_dispatch_workgroup_size() {
    for family in Family::ALL {
        for &entry in family.entries() {
            for &variant in family.variants() {
                let source = shader::render_variant(family, entry, variant);
                let what = format!("{family:?}/{entry}/{variant}");
                assert!(!source.contains("{{"), "{what}: unfilled placeholder");
                let module = naga::front::wgsl::parse_str(&source).expect("parses");
                let computes: Vec<_> =
                    module.entry_points.iter().filter(|e| e.stage == naga::ShaderStage::Compute).collect();
                assert_eq!(computes.len(), family.entries().len(), "{what}: every entry point stays in the module");
                let main = computes.iter().find(|e| e.name == "main").expect("an entry point named main");
                assert_eq!(main.workgroup_size, [family.workgroup_variant(entry, variant), 1, 1], "{what}");
            }
        }
    }
    // the quantized projection: 64 invocations for one row each, 16 for several
    assert_eq!(Family::QProject.workgroup_variant("project", 16 * 4), 16);
    assert_eq!(Family::QProject.workgroup_variant("project", 16), 64);
}

#[test]
fn broken_modules_are_refused_with_their_stage() {
    use kvslice_kernels::KernelError;
    let stage = |source: &str| match shader::check_source("probe", source) {
        Err(KernelError::Shader { stage, .. }) => stage,
        other => panic!("expected a shader error, got {other:?}"),
    };
    assert_eq!(stage("@compute @workgroup_size(1) fn main( {"), "parse");
    // Parses, but stores into a read-only buffer.
    let read_only_store = "@group(0) @binding(0) var<storage, read> a: array<u32>;\n\
                           @compute @workgroup_size(64) fn main(@builtin(local_invocation_index) i: u32) { a[i] = 1u; }";
    assert_eq!(stage(read_only_store), "validate");
    assert_eq!(stage("{{ entry }}"), "template");
    let fine = "@compute @workgroup_size(1) fn main() {}";
    assert!(shader::check_source("probe", fine).is_ok());
}

#[test]
fn parameter_blocks_match_their_rust_structs_and_drift_is_caught() {
    use kvslice_kernels::{KernelError, layout};
    for family in Family::ALL {
        let rust = layout(family).unwrap_or_else(|| panic!("{family:?}: no Rust parameter block"));
        let source = shader::render(family, family.entries()[0]);
        shader::check_params("probe", &source, Some(rust.clone())).unwrap_or_else(|e| panic!("{e}"));
        let drift = |source: &str, rust| match shader::check_params("probe", source, rust) {
            Err(KernelError::Shader { stage: "params", message, .. }) => message,
            other => panic!("{family:?}: drift not caught: {other:?}"),
        };
        // a member inserted before the others shifts every offset
        let shifted = source.replacen("struct Params {", "struct Params {\n    inserted: u32,", 1);
        drift(&shifted, Some(rust.clone()));
        // a member renamed
        let (first, _) = rust.members[0];
        let renamed = source.replacen(&format!("    {first}: "), &format!("    {first}_renamed: "), 1);
        drift(&renamed, Some(rust.clone()));
        // the Rust side growing a member the shader lacks
        let mut grown = rust.clone();
        grown.members.push(("extra", grown.size));
        grown.size += 4;
        drift(&source, Some(grown));
        // a Params struct without a Rust block
        drift(&source, None);
    }
}
