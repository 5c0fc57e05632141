//! Eviction end to end: the statistics recorded during prefill against the policy crate's CPU
//! reference (f64), and compression + decoding on a tiny seeded model against hand-derived
//! expectations (kept sets, fixed-size caches, memory, positions), on the CPU backend and on
//! wgpu.

use burn::tensor::{Device, Tensor, TensorData};
use kvslice_model::Llama;
use kvslice_model::load::load_llama;
use kvslice_policy::NonCausalSpec;
use kvslice_policy::reference::{self, Dims};
use kvslice_runtime::evict::observe::layer_stats;
use kvslice_runtime::{
    Compression, CompressionReport, GenerateOptions, Generator, RuntimeError, Sampler, Session, StatsRequest,
};
use kvslice_tests::{cpu, tiny_hf_weights, wgpu};

/// Deterministic values in [-1, 1) (64-bit LCG, top bits).
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

fn tensor(v: &[f32], shape: [usize; 3], device: &Device) -> Tensor<3> {
    Tensor::<1>::from_data(TensorData::new(v.to_vec(), [v.len()]), device).reshape(shape)
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= 2e-5 + 1e-4 * b.abs(), "{what}[{i}]: {a} vs reference {b}");
    }
}

fn stats_match_reference(device: Device) {
    let dims = Dims { heads: 6, kv_heads: 2, len: 37, head_dim: 16 };
    let (h, kv, n, d) = (dims.heads, dims.kv_heads, dims.len, dims.head_dim);
    // Larger queries make the attention peaked, as in real models.
    let q: Vec<f32> = values(1, h * n * d).iter().map(|x| 3.0 * x).collect();
    let k = values(2, kv * n * d);
    let v = values(3, kv * n * d);
    let raw = values(4, h * n * d);
    let request = StatsRequest {
        windows: vec![8, 1],
        value_weighted: true,
        projection: true,
        accumulated: true,
        counter_causal_layers: vec![0],
        non_causal: vec![NonCausalSpec::whole(16), NonCausalSpec { chunk: 8, start: 3, end: 5 }],
        query_moments_skip: Some(4),
        jacobian: true,
        leverage: true,
        twins: true,
        tail_queries: 0,
        reconstruction: false,
        position_weighted: true,
    };
    let got = pollster::block_on(layer_stats(
        &tensor(&q, [h, n, d], &device),
        &tensor(&raw, [h, n, d], &device),
        &tensor(&k, [kv, n, d], &device),
        &tensor(&v, [kv, n, d], &device),
        &request,
        true,
    ))
    .unwrap();
    for w in [8, 1] {
        let want = reference::window_stats(dims, &q, &k, &v, w).unwrap();
        let s = got.window(w).unwrap();
        assert_eq!((s.heads, s.kv_heads, s.len, s.window), (h, kv, n, w));
        close("mean", &s.mean, &want.mean);
        close("var", &s.var, &want.var);
        close("last", &s.last, &want.last);
        close("entropy", &s.entropy, &want.entropy);
        close("value_weighted", s.value_weighted.as_ref().unwrap(), want.value_weighted.as_ref().unwrap());
        close("projection", s.projection.as_ref().unwrap(), want.projection.as_ref().unwrap());
        close("accumulated", s.accumulated.as_ref().unwrap(), want.accumulated.as_ref().unwrap());
        close("counter_causal", s.counter_causal.as_ref().unwrap(), want.counter_causal.as_ref().unwrap());
        close("jacobian", s.jacobian.as_ref().unwrap(), want.jacobian.as_ref().unwrap());
        close("leverage", s.leverage.as_ref().unwrap(), want.leverage.as_ref().unwrap());
        close("position_weighted", s.position_weighted.as_ref().unwrap(), want.position_weighted.as_ref().unwrap());
        // best twins: the same similarity; the position is the reference's or one whose
        // similarity ties it
        let (sim, index) = (s.twin.as_ref().unwrap(), s.twin_index.as_ref().unwrap());
        close("twin", sim, want.twin.as_ref().unwrap());
        let (ref_sim, ref_index) = kvslice_policy::scorer::twin::twins(&k, kv, n, d).unwrap();
        for (r, (&i, &j)) in index.iter().zip(&ref_index).enumerate() {
            assert!(i == j || (ref_sim[r] - sim[r]).abs() < 1e-5, "twin of row {r}: {i} vs reference {j}");
            if i != u32::MAX {
                assert!((i as usize).abs_diff(r % n) > kvslice_policy::scorer::twin::EXCLUSION, "row {r}");
            }
        }
    }
    // chunks of 16, 16 and 5 (11 padding rows); then one chunk of 64 holding all 37
    let s = got.window(0).unwrap();
    let whole = NonCausalSpec::whole(16);
    close("non_causal", s.non_causal_for(whole).unwrap(), &reference::non_causal_sums(dims, &q, &k, 16).unwrap());
    // a slice: positions 3..32 in chunks of 8, 8, 8 and 5; zero outside
    let sliced = NonCausalSpec { chunk: 8, start: 3, end: 5 };
    let want = reference::non_causal_sums_over(dims, &q, &k, sliced).unwrap();
    close("non_causal (slice)", s.non_causal_for(sliced).unwrap(), &want);
    assert!(want[..3].iter().chain(&want[n - 5..n]).all(|&x| x == 0.0));
    let one = StatsRequest { non_causal: vec![NonCausalSpec::whole(64)], ..StatsRequest::default() };
    let t = |x: &[f32], shape| tensor(x, shape, &device);
    let (tq, traw, tk, tv) = (t(&q, [h, n, d]), t(&raw, [h, n, d]), t(&k, [kv, n, d]), t(&v, [kv, n, d]));
    let padded = pollster::block_on(layer_stats(&tq, &traw, &tk, &tv, &one, false)).unwrap();
    let want = reference::non_causal_sums(dims, &q, &k, 64).unwrap();
    close(
        "non_causal (one padded chunk)",
        padded.window(0).unwrap().non_causal_for(NonCausalSpec::whole(64)).unwrap(),
        &want,
    );
    let m = got.moments.unwrap();
    let want = kvslice_policy::QueryMoments::from_queries(&raw, h, n, d, 4).unwrap();
    close("query mean", &m.mean, &want.mean);
    close("query covariance", &m.cov, &want.cov);
}

#[test]
fn statistics_match_the_reference_on_cpu() {
    stats_match_reference(cpu());
}

#[test]
fn statistics_match_the_reference_on_wgpu() {
    stats_match_reference(wgpu());
}

fn tiny(device: &Device) -> Llama {
    load_llama(&tiny_hf_weights("llama"), device).unwrap()
}

fn prompt(n: usize) -> Vec<u32> {
    // Token ids of the tiny model's 256-entry vocabulary, avoiding the special ids 0..3.
    values(9, n).iter().map(|x| 3 + ((x + 1.0) * 126.0) as u32).collect()
}

fn greedy(max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_new_tokens, sampler: Sampler::greedy(), stop_tokens: Vec::new() }
}

/// Prefill, compression and greedy decoding through the runtime's generation loop: the
/// session it leaves, the tokens and what the compression did.
fn generate<'m>(
    model: &'m Llama,
    ids: &[u32],
    options: &GenerateOptions,
    c: &Compression,
) -> Result<(Session<'m>, Vec<u32>, CompressionReport), RuntimeError> {
    pollster::block_on(async {
        let mut g = Generator::prefill(model, ids, options.clone(), Some(c)).await?;
        g.run().await?;
        let (tokens, report) = (g.tokens().to_vec(), g.report().cloned().unwrap_or_default());
        Ok((g.into_session(), tokens, report))
    })
}

/// Greedy tokens with the whole cache kept: what a budget that evicts nothing must give.
fn full_cache_tokens(model: &Llama, ids: &[u32], max_new_tokens: usize) -> Vec<u32> {
    pollster::block_on(async {
        let mut g = Generator::prefill(model, ids, greedy(max_new_tokens), None).await?;
        g.run().await.map(<[u32]>::to_vec)
    })
    .unwrap()
}

fn compression(model: &Llama, name: &str, budget: &str) -> Compression {
    Compression::new(name, budget, &Compression::model_info(model)).unwrap()
}

/// A budget that covers the prompt keeps everything: the same tokens as the full cache.
fn budget_past_the_prompt_keeps_everything(device: Device) {
    let model = tiny(&device);
    let ids = prompt(150);
    let want = full_cache_tokens(&model, &ids, 12);
    for (name, budget) in [
        ("snapkv", "100%"),
        ("h2o", "4096"),
        ("streaming-llm", "170"),
        ("cake", "200L"),
        ("jacap", "100%"),
        ("snapkv-twin", "100%"),
        ("twinkv", "150"),
        ("inertiakv", "170"),
        // renumbering a cache that keeps every position moves nothing
        ("finch", "100%"),
    ] {
        let c = compression(&model, name, budget);
        let (session, got, report) = generate(&model, &ids, &greedy(12), &c).unwrap();
        assert_eq!(got, want, "{name}@{budget}");
        assert_eq!(report.kept_entries, 150 * 3 * 2, "{name}@{budget}");
        assert_eq!(session.position(), 150 + 11);
    }
}

#[test]
fn budget_past_the_prompt_keeps_everything_cpu() {
    budget_past_the_prompt_keeps_everything(cpu());
}

#[test]
fn budget_past_the_prompt_keeps_everything_wgpu() {
    budget_past_the_prompt_keeps_everything(wgpu());
}

/// A prompt shorter than the policy's observation window (SnapKV's 64, CAKE's 32, Jacap's) is
/// all window, which the policy always keeps: the whole cache and the full cache's tokens, at a
/// budget the prompt exceeds (this was "window 64 not recorded").
#[test]
fn a_prompt_shorter_than_the_window_is_kept_whole() {
    let device = cpu();
    let model = tiny(&device);
    let ids = prompt(20);
    let want = full_cache_tokens(&model, &ids, 6);
    for (name, budget) in [("snapkv", "8"), ("snapkv", "10%"), ("cake", "8"), ("adakv-span", "25%"), ("jacap", "8")] {
        let c = compression(&model, name, budget);
        assert!(c.policy().needs().window > ids.len(), "{name}: the case needs a window longer than the prompt");
        let (session, got, report) = generate(&model, &ids, &greedy(6), &c).unwrap();
        assert_eq!(got, want, "{name}@{budget}");
        assert_eq!(report.kept_entries, 20 * 3 * 2, "{name}@{budget}");
        assert_eq!(session.position(), 20 + 5);
    }
}

/// Finch renumbers what it keeps: with a uniform budget every head keeps `N` entries, which
/// move to positions `0..N`, their keys rotated as if computed there, and decoding goes on at
/// position `N`. Layer 0's keys depend only on each token and its position, so each KV head's
/// must equal those of a fresh prefill of the tokens that head kept, in order.
fn finch_renumbers_the_kept_keys(device: Device) {
    let model = tiny(&device);
    let ids = prompt(150);
    let c = compression(&model, "finch:window=16", "30%");
    let (session, tokens, report) = generate(&model, &ids, &greedy(4), &c).unwrap();
    assert_eq!(tokens.len(), 4);
    let kept = report.kept[0][0].len();
    assert!(kept < 150 && report.kept.iter().flatten().all(|h| h.len() == kept), "a uniform budget");
    assert!(report.kept[0][0] != report.kept[0][1], "the heads keep different tokens");
    assert_eq!(report.renumbered, Some(kept as u32));
    assert_eq!(session.position(), kept as u32 + 3, "decoding went on after the renumbered entries");
    let layer = session.cache().layers()[0].clone();
    let (keys, _) = layer.view();
    let [kv_heads, rows, d] = keys.dims();
    let keys = pollster::block_on(kvslice_runtime::read_f32(keys)).unwrap();
    for h in 0..kv_heads {
        let want_positions: Vec<u32> = (0..kept as u32 + 3).collect();
        assert_eq!(layer.head_positions(h), &want_positions[..], "head {h}: positions");
        let kept_ids: Vec<u32> = report.kept[0][h].iter().map(|&p| ids[p as usize]).collect();
        let fresh = pollster::block_on(async {
            let mut s = Session::new(&model, kept)?;
            s.step(&kept_ids, &mut Sampler::greedy()).await?;
            let (k, _) = s.cache().layers()[0].view();
            kvslice_runtime::read_f32(k).await
        })
        .unwrap();
        for s in 0..kept {
            for i in 0..d {
                let (got, want) = (keys[(h * rows + s) * d + i], fresh[(h * kept + s) * d + i]);
                assert!(
                    (got - want).abs() <= 1e-4 + 1e-4 * want.abs(),
                    "head {h} slot {s}[{i}]: {got} vs fresh {want}"
                );
            }
        }
    }
}

#[test]
fn finch_renumbers_the_kept_keys_cpu() {
    finch_renumbers_the_kept_keys(cpu());
}

#[test]
fn finch_renumbers_the_kept_keys_wgpu() {
    finch_renumbers_the_kept_keys(wgpu());
}

/// SnapKV at 50% of 150 tokens: 75 per head, the 64-token window among them; storage shrinks to
/// the kept tokens plus room for the new ones; decoding continues at the prompt's positions.
fn snapkv_keeps_its_budget(device: Device) {
    let model = tiny(&device);
    let ids = prompt(150);
    let c = compression(&model, "snapkv", "50%");
    let (session, tokens, report) = generate(&model, &ids, &greedy(8), &c).unwrap();
    assert_eq!(tokens.len(), 8);
    assert_eq!(report.kept.len(), 3);
    for layer in &report.kept {
        for head in layer {
            assert_eq!(head.len(), 75);
            assert!(head.windows(2).all(|w| w[0] < w[1]));
            assert!((86..150).all(|p| head.contains(&p)), "window kept");
        }
    }
    // capacity 75 + 7 slots, 3 layers × 2 KV heads × 16 dims × K and V × f32
    assert_eq!(report.compressed_bytes, 3 * 2 * (75 + 7) * 16 * 2 * 4);
    assert_eq!(report.full_bytes, 3 * 2 * 150 * 16 * 2 * 4);
    let layer = session.cache().layers()[0].clone();
    for h in 0..2 {
        let pos = layer.head_positions(h);
        assert_eq!(pos.len(), 75 + 7);
        assert_eq!(&pos[75..], &(150..157).collect::<Vec<u32>>()[..], "new tokens at the original positions");
    }
}

#[test]
fn snapkv_keeps_its_budget_cpu() {
    snapkv_keeps_its_budget(cpu());
}

#[test]
fn snapkv_keeps_its_budget_wgpu() {
    snapkv_keeps_its_budget(wgpu());
}

/// StreamingLLM at a flat 16 tokens: 4 sinks and the 12 most recent positions, after the
/// prefill and after every decode step (the cache never grows).
fn streaming_llm_keeps_sinks_and_recent(device: Device) {
    let model = tiny(&device);
    let ids = prompt(40);
    let c = compression(&model, "streaming-llm", "16");
    let (session, tokens, report) = generate(&model, &ids, &greedy(20), &c).unwrap();
    assert_eq!(tokens.len(), 20);
    let expect_prefill: Vec<u32> = (0..4).chain(28..40).collect();
    assert!(report.kept.iter().flatten().all(|k| *k == expect_prefill));
    // 19 tokens fed after the prompt: positions 40..=58; the 12 newest are 47..=58.
    let expect: Vec<u32> = (0..4).chain(47..59).collect();
    for layer in session.cache().layers() {
        assert_eq!(layer.capacity(), 16);
        for h in 0..2 {
            let mut pos = layer.head_positions(h).to_vec();
            pos.sort_unstable();
            assert_eq!(pos, expect);
        }
    }
    assert_eq!(session.eviction().unwrap().evicted, 19 * 3 * 2);
}

#[test]
fn streaming_llm_keeps_sinks_and_recent_cpu() {
    streaming_llm_keeps_sinks_and_recent(cpu());
}

#[test]
fn streaming_llm_keeps_sinks_and_recent_wgpu() {
    streaming_llm_keeps_sinks_and_recent(wgpu());
}

/// H2O, TOVA and LaCache keep a fixed-size cache while decoding; H2O's recent half stays.
/// (LaCache's compaction runs the in-place kernel on wgpu, a gather on the CPU backend.)
fn decode_time_policies_keep_a_fixed_size(device: Device) {
    let model = tiny(&device);
    let ids = prompt(60);
    for name in ["h2o", "tova", "lacache", "inertiakv", "inertiakv-lazy", "inertiakv-score-free"] {
        let c = compression(&model, name, "24");
        let (session, tokens, _) = generate(&model, &ids, &greedy(30), &c).unwrap();
        assert_eq!(tokens.len(), 30);
        for layer in session.cache().layers() {
            assert_eq!(layer.capacity(), 24, "{name}");
            for h in 0..2 {
                let pos = layer.head_positions(h);
                assert!(pos.len() <= 24);
                assert!(pos.contains(&88), "{name}: the newest token is cached");
                if name == "h2o" {
                    // recent share 0.5 of 24: positions 77..=88 are never evicted
                    assert!((77..=88).all(|p| pos.contains(&p)), "{name}: recent window {pos:?}");
                }
            }
        }
        let eviction = session.eviction().unwrap();
        assert!(eviction.evicted > 0, "{name}");
        // 29 decode steps: InertiaKV folds attention in at each, the lazy variant at steps
        // 1, 5, …, 29 (8), score-free decoding never
        let refreshes = match name {
            "inertiakv" => Some(29),
            "inertiakv-lazy" => Some(8),
            "inertiakv-score-free" => Some(0),
            _ => None,
        };
        if let Some(r) = refreshes {
            assert_eq!(eviction.refreshes(), r, "{name}");
        }
    }
    // CAKE's decoding phase: every layer stays at its own cascade budget (24 per layer on
    // average), full, with the newest token and its 32-step window cached.
    let c = compression(&model, "cake", "40L");
    let (session, tokens, report) = generate(&model, &ids, &greedy(30), &c).unwrap();
    assert_eq!(tokens.len(), 30);
    let mut total = 0;
    for (l, layer) in session.cache().layers().iter().enumerate() {
        assert_eq!(layer.capacity(), report.kept[l][0].len(), "layer {l} keeps its budget");
        total += layer.capacity();
        for h in 0..2 {
            let pos = layer.head_positions(h);
            assert_eq!(pos.len(), layer.capacity());
            assert!((57..=88).all(|p| pos.contains(&p)), "layer {l}: window {pos:?}");
        }
    }
    assert_eq!(total, 40 * 3);
    assert!(session.eviction().unwrap().evicted > 0);
}

#[test]
fn decode_time_policies_keep_a_fixed_size_cpu() {
    decode_time_policies_keep_a_fixed_size(cpu());
}

#[test]
fn decode_time_policies_keep_a_fixed_size_wgpu() {
    decode_time_policies_keep_a_fixed_size(wgpu());
}

#[test]
fn bad_requests_are_errors() {
    let device = cpu();
    let model = tiny(&device);
    let info = Compression::model_info(&model);
    let e = Compression::new("snapkv-turbo", "10%", &info).unwrap_err().to_string();
    assert!(e.contains("snapkv-turbo") && e.contains("streaming-llm") && e.contains("lacache"), "{e}");
    let e = Compression::new("snapkv", "0%", &info).unwrap_err().to_string();
    assert!(e.contains("0%"), "{e}");
    let e = Compression::new("snapkv", "ten", &info).unwrap_err().to_string();
    assert!(e.contains("ten"), "{e}");
    // 600 tokens do not fit the tiny model's 512-token context: refused before prefill.
    let c = compression(&model, "snapkv", "10%");
    let long = prompt(600);
    match generate(&model, &long, &greedy(4), &c) {
        Err(RuntimeError::ContextOverflow { tokens: 600, context: 512, .. }) => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a prompt past the context was accepted"),
    }
    // A budget below the policy's protected window is an error naming both.
    let c = compression(&model, "snapkv", "10%");
    let e = generate(&model, &prompt(100), &greedy(4), &c);
    let e = e.err().expect("10 tokens cannot hold SnapKV's 64-token window").to_string();
    assert!(e.contains("64") && e.contains("10"), "{e}");
}

/// CAKE's cascade compresses each layer as the prefill goes: the kept sets are the top-k of
/// each layer's CAKE scores at the cascade's final budgets (Theorem 1: trimming stage by stage
/// equals one eviction), the budgets spend the whole total, and peak KV memory stays near the
/// budget plus one layer instead of the whole prompt's cache.
#[test]
fn cake_cascade_matches_one_eviction_with_less_memory() {
    let device = cpu();
    let model = tiny(&device);
    let ids = prompt(200);
    let c = compression(&model, "cake", "50L");
    assert!(c.cascades());
    let (_, tokens, report) = generate(&model, &ids, &greedy(6), &c).unwrap();
    assert_eq!(tokens.len(), 6);
    let budgets: Vec<usize> = report.kept.iter().map(|l| l[0].len()).collect();
    assert_eq!(budgets.iter().sum::<usize>(), 50 * 3, "{budgets:?}");
    // The one-shot statistics of the same prompt, scored by the same policy.
    let request = c.request(3);
    let prefilled = pollster::block_on(Session::prefill_for(&model, &ids, &request)).unwrap();
    let policy = c.policy();
    for (l, kept) in report.kept.iter().enumerate() {
        let w = prefilled.stats[l].window(policy.needs().window).unwrap();
        let scores = policy.score_layer(&kvslice_policy::LayerInput::new(w), 50).unwrap().unwrap();
        let want = kvslice_policy::select_heads(&scores, &[budgets[l]; 2], policy.protect(50)).unwrap();
        assert_eq!(kept, &want, "layer {l}");
    }
    // one layer's full K/V (200 slots) + the compressed layers, never the whole prompt's cache
    let layer_bytes = 2 * 200 * 16 * 2 * 4;
    assert!(report.peak_bytes <= layer_bytes + report.compressed_bytes * 2, "{report:?}");
    let (_, one_shot) = pollster::block_on(Session::resume(&model, &prefilled, Some(&c), 6)).unwrap();
    let one_shot = one_shot.unwrap();
    assert!(
        report.peak_bytes < one_shot.peak_bytes,
        "cascade {} vs one-shot {}",
        report.peak_bytes,
        one_shot.peak_bytes
    );
}

/// The model's whole context: a tiny seeded model with a 32K context prefills 32,760 tokens
/// with CAKE's cascade at 10%, and the KV memory held at any point of the prefill stays within
/// the compressed cache plus one layer's full K/V (the cascade's scratch), never the prompt's
/// whole cache (ten times that).
#[test]
fn cake_cascade_prefills_a_32k_context_in_the_budget_plus_one_layer() {
    let weights = kvslice_tests::tiny_hf_weights_with("llama", |c| c.max_position_embeddings = 32768);
    let model = load_llama(&weights, &cpu()).unwrap();
    let n = 32760;
    let ids = prompt(n);
    let c = compression(&model, "cake", "10%");
    assert!(c.cascades());
    let (session, tokens, report) = generate(&model, &ids, &greedy(4), &c).unwrap();
    assert_eq!(tokens.len(), 4);
    assert_eq!(session.position() as usize, n + 3);
    let cfg = &model.config;
    let layer_bytes = cfg.num_kv_heads * n * cfg.head_dim * 2 * 4;
    let whole = cfg.num_layers * layer_bytes;
    assert_eq!(report.full_bytes, whole);
    assert!(report.kept_entries * 10 <= n * cfg.num_layers * cfg.num_kv_heads + 10, "{}", report.kept_entries);
    assert!(
        report.peak_bytes <= report.compressed_bytes + layer_bytes,
        "peak {} > compressed {} + one layer {}",
        report.peak_bytes,
        report.compressed_bytes,
        layer_bytes
    );
    eprintln!(
        "32K cascade: peak {:.2} MiB = compressed {:.2} MiB + one layer {:.2} MiB at most; whole cache {:.2} MiB",
        report.peak_bytes as f64 / 1048576.0,
        report.compressed_bytes as f64 / 1048576.0,
        layer_bytes as f64 / 1048576.0,
        whole as f64 / 1048576.0
    );
}

/// On wgpu, compaction runs the in-place kernel: the same buffers, kept rows moved to the front.
#[test]
fn compaction_is_in_place_on_wgpu() {
    let device = wgpu();
    let geometry = kvslice_cache::CacheGeometry { layers: 1, kv_heads: 2, head_dim: 4, capacity: 6 };
    let mut cache = kvslice_cache::KvCache::new(geometry, &device).unwrap();
    let k: Vec<f32> = (0..2 * 5 * 4).map(|i| i as f32).collect();
    let v: Vec<f32> = (0..2 * 5 * 4).map(|i| 1000.0 + i as f32).collect();
    use kvslice_cache::KvStore;
    cache.append(0, tensor(&k, [2, 5, 4], &device), tensor(&v, [2, 5, 4], &device), &[0, 1, 2, 3, 4]).unwrap();
    let layer = cache.layer_mut(0).unwrap();
    let before = kvslice_kernels::buffer_id(layer.storage().unwrap().0).unwrap();
    layer.compact(&[vec![1, 4], vec![0, 2, 3]]).unwrap();
    assert_eq!(kvslice_kernels::buffer_id(layer.storage().unwrap().0).unwrap(), before, "same buffer");
    assert_eq!(layer.lens(), &[2, 3]);
    assert_eq!(layer.head_positions(0), &[1, 4]);
    assert_eq!(layer.head_positions(1), &[0, 2, 3]);
    let got = layer.storage().unwrap().0.clone().into_data().try_to_vec::<f32>().unwrap();
    // head 0 rows 1 and 4 (values 4..8, 16..20); head 1 rows 0, 2, 3 (20..24, 28..32, 32..36)
    assert_eq!(&got[..8], &[4., 5., 6., 7., 16., 17., 18., 19.]);
    assert_eq!(&got[24..36], &[20., 21., 22., 23., 28., 29., 30., 31., 32., 33., 34., 35.]);
    let vals = layer.storage().unwrap().1.clone().into_data().try_to_vec::<f32>().unwrap();
    assert_eq!(&vals[..4], &[1004., 1005., 1006., 1007.]);
}

/// CriticalKV's input, `‖v_j W_o^h‖₁` per query head, against the policy crate's reference
/// (which takes the output projection in PyTorch's `[hidden, H·d]` layout).
#[test]
fn value_projection_norms_match_the_reference() {
    let device = cpu();
    let model = tiny(&device);
    let (kv, n, d, heads) = (2, 11, 16, 4);
    let v = values(21, kv * n * d);
    let got = kvslice_runtime::evict::value_proj_l1(&model, 1, tensor(&v, [kv, n, d], &device));
    let got = got.into_data().try_to_vec::<f32>().unwrap();
    let w = model.weights.layers[1].self_attn.o_proj.weight().unwrap(); // [H·d, hidden]
    let hidden = w.dims()[1];
    let w_t = w.transpose().into_data().try_to_vec::<f32>().unwrap();
    let dims = Dims { heads, kv_heads: kv, len: n, head_dim: d };
    let want = reference::value_proj_l1(dims, &v, &w_t, hidden).unwrap();
    close("value_proj_l1", &got, &want);
}

/// Score-free decoding (InertiaKV's frozen ranking): with 24 slots and 11 tokens fed after the
/// 60-token prompt, the cache ends with every generated token and the 13 prompt entries that
/// rank best by the last prompt query's head-averaged attention (as the policy crate scores it
/// from the recorded statistics), the lowest going first and ties to the older position.
fn score_free_decoding_evicts_in_the_frozen_order(device: Device) {
    let model = tiny(&device);
    let ids = prompt(60);
    let c = compression(&model, "inertiakv-score-free", "24");
    let (session, tokens, _) = generate(&model, &ids, &greedy(12), &c).unwrap();
    assert_eq!(tokens.len(), 12);
    let prefilled = pollster::block_on(Session::prefill_for(&model, &ids, &c.request(3))).unwrap();
    let policy = c.policy();
    for (l, layer) in session.cache().layers().iter().enumerate() {
        let w = prefilled.stats[l].window(1).unwrap();
        let scores = policy.score_layer(&kvslice_policy::LayerInput::new(w), 24).unwrap().unwrap();
        for h in 0..2 {
            let row = scores.row(h);
            // the prefill keeps the last token and the 23 best others; decoding then drops the
            // 11 lowest of those 24
            let mut order: Vec<u32> = (0..59).collect();
            order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
            let mut kept: Vec<u32> = order[..23].to_vec();
            kept.push(59);
            kept.sort_by(|&a, &b| row[a as usize].total_cmp(&row[b as usize]).then(a.cmp(&b)));
            let mut want: Vec<u32> = kept[11..].to_vec();
            want.extend(60..71);
            want.sort_unstable();
            let mut got = layer.head_positions(h).to_vec();
            got.sort_unstable();
            assert_eq!(got, want, "layer {l} head {h}");
        }
    }
}

#[test]
fn score_free_decoding_evicts_in_the_frozen_order_cpu() {
    score_free_decoding_evicts_in_the_frozen_order(cpu());
}

#[test]
fn score_free_decoding_evicts_in_the_frozen_order_wgpu() {
    score_free_decoding_evicts_in_the_frozen_order(wgpu());
}

/// Records each layer's query of a one-token forward pass over a cache (the test's own
/// [`kvslice_cache::KvStore`], independent of the runtime's).
struct QueryRecorder {
    cache: kvslice_cache::KvCache,
    queries: Vec<Vec<f32>>,
}

impl QueryRecorder {
    /// A plain forward pass of `ids` from position 0 over a fresh cache of their length.
    fn forward(model: &Llama, ids: &[u32], device: &Device) -> Self {
        let c = &model.config;
        let geometry = kvslice_cache::CacheGeometry {
            layers: c.num_layers,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            capacity: ids.len(),
        };
        let positions: Vec<u32> = (0..ids.len() as u32).collect();
        let mut plain =
            QueryRecorder { cache: kvslice_cache::KvCache::new(geometry, device).unwrap(), queries: Vec::new() };
        model.forward(ids, &positions, &mut plain).unwrap();
        plain
    }

    /// Layer `l`'s cached keys and values, `[H_kv, n, d]` each, on the host.
    fn host_kv(&self, l: usize) -> (Vec<f32>, Vec<f32>) {
        let (k, v) = kvslice_cache::KvStore::layer(&self.cache, l).unwrap().view();
        let read = |x: Tensor<3>| x.into_data().try_to_vec::<f32>().unwrap();
        (read(k), read(v))
    }
}

impl kvslice_cache::KvStore for QueryRecorder {
    fn append(&mut self, layer: usize, k: Tensor<3>, v: Tensor<3>, positions: &[u32]) -> kvslice_cache::Result<()> {
        self.cache.append(layer, k, v, positions)
    }

    fn layer(&self, layer: usize) -> kvslice_cache::Result<&kvslice_cache::LayerKv> {
        self.cache.layer(layer)
    }

    fn observe_queries(&mut self, _: usize, rotated: &Tensor<3>, _: &Tensor<3>) -> kvslice_cache::Result<()> {
        self.queries.push(rotated.clone().into_data().try_to_vec::<f32>().unwrap());
        Ok(())
    }
}

/// TOVA re-scoring the cache every 4 decode steps (`tova:every=4`, kvpress's `DecodingPress`
/// around `TOVAPress`) at a flat 16 tokens over a 40-token prompt: the cache grows by 4 between
/// compressions and is compacted back to 16 before the 5th and the 9th decode step. The second
/// compression keeps, in every layer, the newest entry and the 15 others with the most
/// attention from the last decoded query averaged over all the layer's heads: worked out here
/// in f64 from that query and the cached keys, recomputed by replaying the decode step on a
/// copy of the cache through the model alone.
#[test]
fn recompression_keeps_what_the_last_query_attends_to() {
    let device = cpu();
    let model = tiny(&device);
    let ids = prompt(40);
    let c = compression(&model, "tova:every=4", "16");
    let (caches, tokens, recompressions) = pollster::block_on(async {
        let mut g = Generator::prefill(&model, &ids, greedy(13), Some(&c)).await.unwrap();
        let mut caches = Vec::new();
        let mut recompressions = Vec::new();
        // caches[j]: after the j-th decode step (caches[0]: after the prefill)
        while g.next().await.unwrap().is_some() {
            caches.push(g.session().cache().clone());
            recompressions.push(g.session().eviction().unwrap().recompressions());
        }
        (caches, g.tokens().to_vec(), recompressions)
    });
    assert_eq!(tokens.len(), 13);
    assert_eq!(recompressions, [0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
    let lens = |j: usize| caches[j].layers().iter().map(|l| l.lens().to_vec()).collect::<Vec<_>>();
    for (j, want) in [(0, 16), (4, 20), (5, 17), (8, 20), (9, 17), (12, 20)] {
        assert!(lens(j).iter().flatten().all(|&n| n == want), "after step {j}: {:?}", lens(j));
    }
    assert!(caches[12].layers().iter().all(|l| l.capacity() == 20), "16 kept + 4 between compressions");
    // Replay decode step 8 (token 7 at position 47) on the cache after step 7.
    let mut replay = QueryRecorder { cache: caches[7].clone(), queries: Vec::new() };
    model.forward(&[tokens[7]], &[47], &mut replay).unwrap();
    let cfg = &model.config;
    let (heads, kv_heads, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let group = heads / kv_heads;
    for (l, layer) in replay.cache.layers().iter().enumerate() {
        assert_eq!(layer.lens(), lens(8)[l].as_slice(), "the replay holds what the session held");
        let (k, _) = layer.view();
        let k = k.into_data().try_to_vec::<f32>().unwrap();
        let q = &replay.queries[l];
        let n = 20;
        let mut score = vec![0.0f64; n];
        for h in 0..heads {
            let kh = h / group;
            let logits: Vec<f64> = (0..n)
                .map(|j| {
                    let dot: f64 = (0..d).map(|i| f64::from(q[h * d + i]) * f64::from(k[(kh * n + j) * d + i])).sum();
                    dot / (d as f64).sqrt()
                })
                .collect();
            let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = logits.iter().map(|x| (x - max).exp()).sum();
            for j in 0..n {
                score[j] += (logits[j] - max).exp() / z / heads as f64;
            }
        }
        for h in 0..kv_heads {
            let positions = layer.head_positions(h);
            assert_eq!(positions[n - 1], 47);
            let mut order: Vec<usize> = (0..n - 1).collect();
            order.sort_by(|&a, &b| score[b].total_cmp(&score[a]).then(a.cmp(&b)));
            let threshold = score[order[14]];
            // after step 9: the 16 kept entries, then the token of step 9 (position 48)
            let after = caches[9].layers()[l].head_positions(h);
            assert_eq!(after.len(), 17);
            assert_eq!(after[16], 48);
            assert!(after[..16].contains(&47), "layer {l} head {h}: the newest entry is kept");
            for (s, &p) in positions.iter().enumerate().take(n - 1) {
                let kept = after[..16].contains(&p);
                // near-ties (f32 against f64) may go either way
                if (score[s] - threshold).abs() > 1e-6 {
                    assert_eq!(kept, score[s] > threshold, "layer {l} head {h} position {p}: score {}", score[s]);
                }
            }
        }
    }
}

/// SnapKV with an 8-query window re-scoring every 4 steps (`snapkv:window=8,kernel=3,every=4`)
/// at 24 tokens over a 60-token prompt: each compression keeps 24 entries per head with the 8
/// newest among them (the window whose queries were observed), on the CPU backend and through
/// the window-statistics kernel on wgpu, where the two must keep the same entries.
fn recompression_holds_the_budget(device: Device) -> Vec<Vec<Vec<u32>>> {
    let model = tiny(&device);
    let ids = prompt(60);
    let c = compression(&model, "snapkv:window=8,kernel=3,every=4", "24");
    let (session, tokens, report) = generate(&model, &ids, &greedy(23), &c).unwrap();
    assert_eq!(tokens.len(), 23);
    assert!(report.kept.iter().flatten().all(|k| k.len() == 24));
    let eviction = session.eviction().unwrap();
    // 22 decode steps: compressions before steps 5, 9, 13, 17, 21; 4 entries per head each
    assert_eq!(eviction.recompressions(), 5);
    assert_eq!(eviction.evicted, 5 * 4 * 3 * 2);
    let mut kept = Vec::new();
    for layer in session.cache().layers() {
        assert_eq!(layer.capacity(), 28);
        for h in 0..2 {
            let pos = layer.head_positions(h);
            // 24 after the compression before step 21, then steps 21 and 22 (positions 80, 81)
            assert_eq!(pos.len(), 26);
            assert!(pos.windows(2).all(|w| w[0] < w[1]), "slot order is position order");
            assert!((72..=81).all(|p| pos.contains(&p)), "the window and the new tokens: {pos:?}");
            kept.push(pos.to_vec());
        }
    }
    vec![kept]
}

#[test]
fn recompression_holds_the_budget_on_cpu_and_wgpu_alike() {
    let on_cpu = recompression_holds_the_budget(cpu());
    let on_wgpu = recompression_holds_the_budget(wgpu());
    assert_eq!(on_cpu, on_wgpu, "the kernel route keeps what Burn ops keep");
}

#[test]
fn recompression_refuses_what_decode_queries_cannot_score() {
    let device = cpu();
    let model = tiny(&device);
    let info = Compression::model_info(&model);
    for name in ["h2o:every=8", "counter-causal:every=2", "expected-attention:every=4", "twinkv:every=4"] {
        let e = Compression::new(name, "50%", &info).unwrap_err().to_string();
        assert!(e.contains("every") && e.contains("cannot compute"), "{name}: {e}");
    }
}

/// A copy of a cache that keeps the queries each layer offers (after RoPE).
struct Recording {
    cache: kvslice_runtime::KvCache,
    queries: Vec<Option<Tensor<3>>>,
}

impl kvslice_cache::KvStore for Recording {
    fn append(&mut self, layer: usize, k: Tensor<3>, v: Tensor<3>, positions: &[u32]) -> kvslice_cache::Result<()> {
        self.cache.append(layer, k, v, positions)
    }

    fn layer(&self, layer: usize) -> kvslice_cache::Result<&kvslice_runtime::LayerKv> {
        self.cache.layer(layer)
    }

    fn observe_queries(&mut self, layer: usize, rotated: &Tensor<3>, _raw: &Tensor<3>) -> kvslice_cache::Result<()> {
        self.queries[layer] = Some(rotated.clone());
        Ok(())
    }
}

/// KVzip's reconstruction pass on the tiny model: the table against the policy crate's f64
/// reference fed with the queries and keys of the same passes recorded here (three chunks of
/// a context that starts after two template tokens, each with its instruction, the previous
/// chunk's last 8 tokens and the turn change); the prompt's cache is left as it was; `kvzip`
/// then compresses to its budget and keeps its sinks; without the prompt it is refused.
fn reconstruction_matches_the_reference(device: Device) {
    use kvslice_runtime::ReconstructionPrompt;
    let model = tiny(&device);
    let (layers, hk, n) = (model.config.num_layers, model.config.num_kv_heads, 20);
    let ids = prompt(n);
    let rp = ReconstructionPrompt { first: vec![5, 6, 7], next: vec![8, 9], suffix: vec![10], chunk: 8, sinks: 4 };
    let request = StatsRequest { windows: vec![1], reconstruction: true, ..StatsRequest::default() };
    let mut prefilled = pollster::block_on(Session::prefill_for(&model, &ids, &request)).unwrap();
    let before = prefilled.cache.lens_by_layer();
    pollster::block_on(prefilled.reconstruct(&model, &rp, 2..n)).unwrap();
    assert_eq!(prefilled.cache.lens_by_layer(), before, "the prompt's cache is untouched");
    let all: Vec<Vec<Vec<u32>>> = (0..layers).map(|_| vec![(0..n as u32).collect(); hk]).collect();
    let mut want = vec![vec![0f32; hk * n]; layers];
    for (start, end, previous) in [(2, 10, None), (10, 18, Some(10)), (18, 20, Some(18))] {
        let mut tokens = match previous {
            None => rp.first.clone(),
            Some(p) => [rp.next.clone(), ids[p - 8..p].to_vec()].concat(),
        };
        tokens.extend_from_slice(&rp.suffix);
        tokens.extend_from_slice(&ids[start..end]);
        let r = tokens.len();
        let cache = kvslice_runtime::evict::compress_cache(&prefilled.cache, &all, r, 0).unwrap();
        let mut rec = Recording { cache, queries: vec![None; layers] };
        let positions: Vec<u32> = (n as u32..(n + r) as u32).collect();
        model.forward(&tokens, &positions, &mut rec).unwrap();
        for (l, table) in want.iter_mut().enumerate() {
            let q = pollster::block_on(kvslice_runtime::read_f32(rec.queries[l].take().unwrap())).unwrap();
            let (keys, _) = rec.cache.layers()[l].view();
            let [_, total, d] = keys.dims();
            let k = pollster::block_on(kvslice_runtime::read_f32(keys)).unwrap();
            let dims = Dims { heads: model.config.num_heads, kv_heads: hk, len: total, head_dim: d };
            let sinks = 4.min(start);
            let got = reference::reconstruction_scores(dims, &q, &k, r, sinks, start..end).unwrap();
            let m = end - start;
            for h in 0..hk {
                table[h * n + start..h * n + end].copy_from_slice(&got[h * m..(h + 1) * m]);
            }
        }
    }
    for (l, stats) in prefilled.stats.iter().enumerate() {
        let got = stats.window(1).unwrap().reconstruction.as_ref().unwrap();
        close(&format!("reconstruction of layer {l}"), got, &want[l]);
    }
    // kvzip at 50%: 10 of 20 per head on average, the 4 sinks in every head
    let c = compression(&model, "kvzip", "50%");
    let (_, report) = pollster::block_on(Session::resume(&model, &prefilled, Some(&c), 1)).unwrap();
    let report = report.unwrap();
    let kept: usize = report.kept.iter().flatten().map(Vec::len).sum();
    assert_eq!(kept, 10 * layers * hk);
    assert!(report.kept.iter().flatten().all(|h| h.starts_with(&[0, 1, 2, 3])));
    // the generation loop runs the pass itself, given the prompt
    let Err(err) = generate(&model, &ids, &greedy(2), &c) else { panic!("kvzip without its prompt ran") };
    assert!(err.to_string().contains("reconstruct"), "{err}");
    let (_, tokens, report) = generate(&model, &ids, &greedy(2), &c.with_reconstruction(rp)).unwrap();
    assert_eq!(tokens.len(), 2);
    assert_eq!(report.kept.iter().flatten().map(Vec::len).sum::<usize>(), 10 * layers * hk);
}

#[test]
fn reconstruction_matches_the_reference_on_cpu() {
    reconstruction_matches_the_reference(cpu());
}

#[test]
fn reconstruction_matches_the_reference_on_wgpu() {
    reconstruction_matches_the_reference(wgpu());
}

/// Chunked prefill: the policies' statistics from a prompt of 400 tokens fed in passes of 24
/// (layer by layer; the 64-token window spans the last three, the last of 16 tokens) are those of one pass, so every policy keeps the same entries
/// and decodes the same tokens, whatever its statistics need: a window (SnapKV, TOVA, Jacap),
/// CAKE's cascade, every query's accumulated attention (H2O), the counter-causal sums, the
/// non-causal tables, the pre-RoPE query moments (expected attention), the keys alone (TwinKV).
fn chunked_prefill_keeps_what_one_pass_keeps(device: Device) {
    let mut model = tiny(&device);
    let ids = prompt(400);
    for name in
        ["snapkv", "cake", "h2o", "tova", "counter-causal", "non-causal-attn", "expected-attention", "jacap", "twinkv"]
    {
        let c = compression(&model, name, "40%");
        assert_eq!(c.cascades(), name == "cake");
        model.set_prefill_chunk(0);
        let (_, want_tokens, want) = generate(&model, &ids, &greedy(6), &c).unwrap();
        model.set_prefill_chunk(24);
        let (session, tokens, got) = generate(&model, &ids, &greedy(6), &c).unwrap();
        assert!(!want.kept.is_empty(), "{name}");
        assert_eq!(got.kept, want.kept, "{name}: kept sets");
        assert_eq!(tokens, want_tokens, "{name}: tokens");
        assert_eq!(session.position(), 400 + 5, "{name}");
        assert!(got.kept_entries < 400 * 3 * 2, "{name} kept everything");
    }
}

#[test]
fn chunked_prefill_keeps_what_one_pass_keeps_cpu() {
    chunked_prefill_keeps_what_one_pass_keeps(cpu());
}

#[test]
fn chunked_prefill_keeps_what_one_pass_keeps_wgpu() {
    chunked_prefill_keeps_what_one_pass_keeps(wgpu());
}

/// H2O's accumulated attention comes out of the model's own attention pass (each chunk's
/// attention adds its queries' weights into the slots' sums): over a prompt of 100 tokens in
/// chunks of 24 (the last of 4 rows, which the CPU backend attends with Burn's ops instead of
/// the tiled kernel) it equals the policy crate's reference, computed in f64 from the queries
/// and keys of a plain one-pass forward.
fn accumulated_attention_from_the_prefill_matches_the_reference(device: Device) {
    let mut model = tiny(&device);
    let ids = prompt(100);
    let c = &model.config;
    let dims = Dims { heads: c.num_heads, kv_heads: c.num_kv_heads, len: ids.len(), head_dim: c.head_dim };
    let plain = QueryRecorder::forward(&model, &ids, &device);
    model.set_prefill_chunk(24);
    let request = StatsRequest { accumulated: true, ..StatsRequest::default() };
    let prefilled = pollster::block_on(Session::prefill_for(&model, &ids, &request)).unwrap();
    for (l, q) in plain.queries.iter().enumerate() {
        let (k, v) = plain.host_kv(l);
        let want = reference::window_stats(dims, q, &k, &v, 1).unwrap();
        let got = prefilled.stats[l].window(0).unwrap().accumulated.as_ref().unwrap();
        close(&format!("layer {l} accumulated"), got, want.accumulated.as_ref().unwrap());
    }
}

#[test]
fn accumulated_attention_from_the_prefill_matches_the_reference_cpu() {
    accumulated_attention_from_the_prefill_matches_the_reference(cpu());
}

#[test]
fn accumulated_attention_from_the_prefill_matches_the_reference_wgpu() {
    accumulated_attention_from_the_prefill_matches_the_reference(wgpu());
}

/// DistillCache's traces: for a text of 100 tokens and a context of 60, an entry's utility is
/// the attention the 40 later queries of its KV head's group put on it, worked out from a plain
/// forward's queries and keys by the policy crate's reference (the window statistics' mean over
/// the last 40 queries, times 40); its features are those of the context's cached entries.
fn traces_hold_the_attention_entries_receive_later(device: Device) {
    let model = tiny(&device);
    let ids = prompt(100);
    let c = &model.config;
    let (t, ctx) = (ids.len(), 60);
    let plain = QueryRecorder::forward(&model, &ids, &device);
    let lists = pollster::block_on(kvslice_runtime::traces::record(&model, &ids, ctx)).unwrap();
    assert_eq!((lists.len(), lists[0].len()), (c.num_layers, c.num_kv_heads));
    let dims = Dims { heads: c.num_heads, kv_heads: c.num_kv_heads, len: t, head_dim: c.head_dim };
    let group = c.num_heads / c.num_kv_heads;
    let d = c.head_dim;
    for (l, q) in plain.queries.iter().enumerate() {
        let (k, v) = plain.host_kv(l);
        let stats = reference::window_stats(dims, q, &k, &v, t - ctx).unwrap();
        // the context's keys and values: the first 60 slots of each head
        let narrow = |x: &[f32]| {
            (0..c.num_kv_heads).flat_map(|h| x[h * t * d..(h * t + ctx) * d].to_vec()).collect::<Vec<f32>>()
        };
        let (kc, vc) = (narrow(&k), narrow(&v));
        let view = kvslice_policy::KvView {
            kv_heads: c.num_kv_heads,
            len: ctx,
            head_dim: d,
            keys: Some(&kc),
            values: Some(&vc),
        };
        assert_eq!(lists[l].len(), c.num_kv_heads);
        for (h, list) in lists[l].iter().enumerate() {
            let want: Vec<f32> = (0..ctx)
                .map(|j| (h * group..(h + 1) * group).map(|qh| stats.mean[qh * t + j] * (t - ctx) as f32).sum())
                .collect();
            // a difference of two sums over the prefix queries: absolute errors of the sums' size
            let scale = want.iter().copied().fold(0f32, f32::max);
            for (j, (a, b)) in list.utility.iter().zip(&want).enumerate() {
                assert!((a - b).abs() <= 1e-4 * scale + 1e-4 * b.abs(), "layer {l} head {h} utility[{j}]: {a} vs {b}");
            }
            let features = kvslice_policy::scorer::distill::head_features(&view, &kc, &vc, h);
            close(&format!("layer {l} head {h} features"), &list.features, &features);
        }
    }
    assert!(
        pollster::block_on(kvslice_runtime::traces::record(&model, &ids, 100)).is_err(),
        "no text after the context"
    );
}

#[test]
fn traces_hold_the_attention_entries_receive_later_cpu() {
    traces_hold_the_attention_entries_receive_later(cpu());
}

#[test]
fn traces_hold_the_attention_entries_receive_later_wgpu() {
    traces_hold_the_attention_entries_receive_later(wgpu());
}

/// `distillcache:weights=FILE` with networks trained on the tiny model's own traces: each
/// layer's heads keep the 4 sinks and the entries their layer's networks score highest, the
/// scores worked out from a plain forward's cache.
fn distillcache_keeps_what_its_networks_rank_first(device: Device) {
    let model = tiny(&device);
    let c = &model.config;
    let text = prompt(160);
    let lists = pollster::block_on(kvslice_runtime::traces::record(&model, &text[..140], 100)).unwrap();
    let lists: Vec<Vec<_>> = lists.iter().map(|l| l.iter().map(|x| vec![x.without_sinks(4)]).collect()).collect();
    let config = kvslice_policy::learn::TrainConfig { hidden: 4, steps: 10, ..Default::default() };
    let weights = kvslice_policy::learn::train(&lists, c.head_dim, &config, 1).unwrap();
    let path = std::env::temp_dir().join(format!(
        "kvslice-distill-{}-{:?}.safetensors",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&path, weights.to_safetensors().unwrap()).unwrap();
    let ids = prompt(90);
    let comp = compression(&model, &format!("distillcache:weights={}", path.display()), "20");
    let (_, tokens, report) = generate(&model, &ids, &greedy(4), &comp).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(tokens.len(), 4);
    let plain = QueryRecorder::forward(&model, &ids, &device);
    let mut differ = false;
    for (l, kept) in report.kept.iter().enumerate() {
        let (k, v) = plain.host_kv(l);
        let view = kvslice_policy::KvView {
            kv_heads: c.num_kv_heads,
            len: ids.len(),
            head_dim: c.head_dim,
            keys: Some(&k),
            values: Some(&v),
        };
        assert_eq!(kept.len(), c.num_kv_heads);
        for (h, kept) in kept.iter().enumerate() {
            let x = kvslice_policy::scorer::distill::head_features(&view, &k, &v, h);
            let scores = weights.head(l, h).score(&x);
            let protect = kvslice_policy::Protect { sinks: 4, recent: 0 };
            let want = kvslice_policy::select_top_k(&scores, 20, protect).unwrap();
            assert_eq!(kept, &want, "layer {l} head {h}");
            // another layer's network would keep other entries
            let other = weights.head((l + 1) % c.num_layers, h).score(&x);
            differ |= kvslice_policy::select_top_k(&other, 20, protect).unwrap() != want;
        }
    }
    assert!(differ, "the layers' networks rank differently");
}

#[test]
fn distillcache_keeps_what_its_networks_rank_first_cpu() {
    distillcache_keeps_what_its_networks_rank_first(cpu());
}

#[test]
fn distillcache_keeps_what_its_networks_rank_first_wgpu() {
    distillcache_keeps_what_its_networks_rank_first(wgpu());
}
