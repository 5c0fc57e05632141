//! The portable conformance suite (`kvslice_kernels::conformance`, the one the browser page
//! runs on WebGPU) on the native wgpu device: every case must pass here too.

use crate::common::device;

#[test]
fn portable_suite_passes_on_the_native_device() {
    let results = pollster::block_on(kvslice_kernels::conformance::run_all(&device()));
    assert!(results.len() >= 64, "only {} cases", results.len());
    let failed: Vec<String> = results
        .iter()
        .filter(|r| !r.passed())
        .map(|r| format!("{} [{}]: {}", r.kernel, r.case, r.failure.as_deref().unwrap_or("")))
        .collect();
    assert!(failed.is_empty(), "failed cases:\n{}", failed.join("\n"));
    for r in &results {
        assert!(r.checked > 0, "{} [{}] compared nothing", r.kernel, r.case);
    }
}
