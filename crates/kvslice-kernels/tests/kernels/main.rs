//! Kernel tests: shader portability (naga), then every kernel against its CPU twin and
//! hand-computed cases on the wgpu device (lavapipe in CI), and the typed errors.
//! One test binary, so the Burn stack is linked once.

mod common;
mod compact;
mod conformance;
mod decode;
mod errors;
mod gemm;
mod linear;
mod shaders;
mod stats;
