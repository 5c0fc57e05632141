//! Retrieval suites (passkey, needle-in-a-haystack, variable tracking) over public-domain prose,
//! the cases file format, evaluation reports and plots. Pure Rust, no GPU.
