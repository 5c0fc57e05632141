//! Soak: long generations under every decode-time eviction rule at a fixed budget, on a tiny
//! seeded model whose context is raised to 32K (the runtime's memory and state, not the text,
//! are under test). For each rule: the cache stays at its size once the prompt is compressed,
//! no step fails (a NaN logit is an error), resident memory is flat after warm-up, and two runs
//! with the same seed give the same tokens.
//!
//! CI runs 500 tokens per rule on the CPU backend and, for one rule of each kind, on lavapipe. The long runs reported in
//! docs/RELIABILITY.md (`scripts/soak.sh`) set `KVSLICE_SOAK_TOKENS` (and
//! `KVSLICE_SOAK_DEVICE=cpu|wgpu` for one device only).

use burn::tensor::Device;
use kvslice_model::Llama;
use kvslice_model::load::load_llama;
use kvslice_runtime::{Compression, GenerateOptions, Generator, Sampler};
use kvslice_tests::{cpu, tiny_hf_weights_with, wgpu};

const BUDGET: usize = 256;
const PROMPT: usize = 320;
/// Decode-time rules (each a policy's own, or a scorer re-compressing every 64 steps).
const RULES: [&str; 7] = ["streaming-llm", "h2o", "tova", "inertiakv", "lacache", "cake", "knorm:every=64"];
/// On lavapipe in CI (a decode step there takes 10–40 ms): one rule of each kind.
const CI_WGPU_RULES: [&str; 4] = ["streaming-llm", "tova", "lacache", "knorm:every=64"];

/// The tiny llama (tests/golden/tiny/llama) with a 32,768-token context.
fn long_context_model(device: &Device) -> Llama {
    let weights = tiny_hf_weights_with("llama", |c| c.max_position_embeddings = 32768);
    load_llama(&weights, device).unwrap()
}

/// Resident memory of this process (bytes), from /proc.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Least-squares slope of `y` against `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

struct Run {
    tokens: Vec<u32>,
    /// Largest and smallest cache length (entries per layer and KV head, on average) seen after
    /// each step.
    lens: (usize, usize),
    /// Slots allocated in all layers after the first step and at the end.
    capacity: (usize, usize),
    /// (tokens generated, resident bytes) every 100 tokens.
    rss: Vec<(f64, f64)>,
    seconds: f64,
}

fn run(model: &Llama, rule: &str, new: usize) -> Run {
    let prompt: Vec<u32> = (0..PROMPT).map(|i| 3 + ((i * 7919 + 13) % 250) as u32).collect();
    let compression = Compression::new(rule, &BUDGET.to_string(), &Compression::model_info(model)).unwrap();
    let options =
        GenerateOptions { max_new_tokens: new, sampler: Sampler::new(0.9, 0.95, 11).unwrap(), stop_tokens: Vec::new() };
    let t0 = std::time::Instant::now();
    pollster::block_on(async {
        let mut g = Generator::prefill(model, &prompt, options, Some(&compression)).await.unwrap();
        let (mut most, mut least, mut capacity) = (0, usize::MAX, 0);
        let mut first_capacity = None;
        let mut samples = Vec::new();
        let mut i = 0;
        while let Some(token) = g.next().await.unwrap_or_else(|e| panic!("{rule}: step {i}: {e}")) {
            assert!(!token.stop);
            // Entries per (layer, KV head) on average: CAKE's cascade gives layers different
            // shares of the same total.
            let layers = g.session().cache().layers();
            let heads = layers.len() * layers[0].lens().len();
            let total: usize = layers.iter().flat_map(|l| l.lens().iter()).sum();
            most = most.max(total.div_ceil(heads));
            least = least.min(total / heads);
            capacity = capacity.max(layers.iter().map(|l| l.capacity()).sum());
            first_capacity.get_or_insert(capacity);
            i += 1;
            if i % 100 == 0 {
                samples.push((i as f64, rss() as f64));
            }
        }
        Run {
            tokens: g.tokens().to_vec(),
            lens: (most, least),
            capacity: (first_capacity.unwrap_or(0), capacity),
            rss: samples,
            seconds: t0.elapsed().as_secs_f64(),
        }
    })
}

fn soak(device: Device, label: &str, new: usize, rules: &[&str]) {
    let model = long_context_model(&device);
    for &rule in rules {
        let first = run(&model, rule, new);
        let second = run(&model, rule, new);
        assert_eq!(first.tokens.len(), new, "{label} {rule}: tokens generated");
        assert_eq!(first.tokens, second.tokens, "{label} {rule}: two runs with one seed differ");
        // The cache holds the budget: the newest token may sit beside it until the next
        // step's eviction, the re-compressing scorer grows by up to 64 between compressions,
        // and LaCache compacts a rung at a time (freeing up to an eighth of the budget at once).
        let (below, above) = match rule {
            "lacache" => (BUDGET / 8, 1),
            r if r.contains("every=") => (1, 64),
            _ => (1, 1),
        };
        let (most, least) = first.lens;
        assert!(
            most <= BUDGET + above && least + below >= BUDGET,
            "{label} {rule}: cache between {least} and {most} entries per layer and head"
        );
        assert_eq!(first.capacity.0, first.capacity.1, "{label} {rule}: the cache's storage grew");
        // Memory after warm-up (the second run, its first fifth left out).
        let warm: Vec<(f64, f64)> = second.rss.iter().copied().filter(|p| p.0 >= new as f64 / 5.0).collect();
        let per_1k = slope(&warm) * 1000.0;
        let (lo, hi) = warm.iter().fold((f64::MAX, 0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
        eprintln!(
            "soak {label} {rule}: {new} tokens in {:.1} s ({:.2} ms/token); cache {least}..{most} per layer and head; \
             RSS {:.1}..{:.1} MiB after warm-up, slope {:+.1} KiB per 1000 tokens",
            second.seconds,
            second.seconds * 1e3 / new as f64,
            lo / 1048576.0,
            hi / 1048576.0,
            per_1k / 1024.0
        );
        // A leak of one cache row per step (3 layers × 2 heads × 16 × 2 × 4 bytes) is 0.75
        // MiB per 1000 tokens; a leaked cache copy per step is 190 MiB.
        assert!(per_1k < 4.0 * 1048576.0, "{label} {rule}: resident memory grows {per_1k} bytes per 1000 tokens");
    }
}

/// `KVSLICE_SOAK_TOKENS`, for the long runs.
fn long_run() -> Option<usize> {
    std::env::var("KVSLICE_SOAK_TOKENS").ok().and_then(|v| v.parse().ok())
}

fn device_wanted(name: &str) -> bool {
    std::env::var("KVSLICE_SOAK_DEVICE").map_or(true, |d| d == name)
}

/// Both devices in one test, one after the other: resident memory is read per process.
#[test]
fn long_generations_hold_their_budget_and_memory() {
    if device_wanted("cpu") {
        soak(cpu(), "cpu", long_run().unwrap_or(500), &RULES);
    }
    if device_wanted("wgpu") {
        let rules: &[&str] = if long_run().is_some() { &RULES } else { &CI_WGPU_RULES };
        soak(wgpu(), "wgpu", long_run().unwrap_or(500), rules);
    }
}
