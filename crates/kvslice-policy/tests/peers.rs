//! Cross-check against the peers' own code: kvpress 0.5.5 and ports of cakekv and FFY0/AdaKV
//! (scripts/peers/gen_peers.py). Every kept set must equal the peer's exactly; the summary
//! printed with `--nocapture` gives the figures.

mod common;

use common::{Peers, jaccard_distance};
use kvslice_policy::alloc::{AdaKv, AdaMode, Allocator, Cake, CakeCascade, Global, LayerScores, PyramidKv, Uniform};
use kvslice_policy::reference::{non_causal_sums, non_causal_sums_over, reconstruction_scores};
use kvslice_policy::scorer::leverage::leverage_scores;
use kvslice_policy::{
    Block, BudgetSpec, CakeIndicator, ChunkKv, Compactor, CriticalKv, Cur, ExpectedAttention, Finch, GroupReduce, H2o,
    KeyDiff, Knorm, KvView, Kvzip, LagKv, Laziness, Leverage, NonCausalAttn, NonCausalSpec, NonCausalTable, Pooling,
    Protect, ScoreInput, Scorer, Scores, SimLayer, SimLayerBudget, SnapKv, StreamingLlm, Tova, WindowStats,
    select_heads, select_top_k,
};
use serde_json::Value;

type Kept = Vec<Vec<Vec<u32>>>;

fn peer_kept(case: &Value) -> Kept {
    case["kept"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            l.as_array()
                .unwrap()
                .iter()
                .map(|h| h.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect())
                .collect()
        })
        .collect()
}

fn f(case: &Value, k: &str) -> f64 {
    case["params"][k].as_f64().unwrap_or_else(|| panic!("param {k}"))
}

fn u(case: &Value, k: &str) -> usize {
    case["params"][k].as_u64().unwrap_or_else(|| panic!("param {k}")) as usize
}

/// kvpress's `compute_n_kept`.
fn n_kept(len: usize, ratio: f64) -> usize {
    ((len as f64 * (1.0 - ratio)) as usize).max(1)
}

struct Layer {
    stats: kvslice_policy::WindowStats,
}

/// Scores every layer with `scorer` over window `window`.
fn score_layers(p: &mut Peers, scorer: &dyn Scorer, window: usize, budget: usize) -> (Vec<Layer>, Vec<Scores>) {
    let mut layers = Vec::new();
    let mut scores = Vec::new();
    for l in 0..p.layers {
        let stats = p.stats(l, window);
        let moments = p.moments(l, 4);
        let proj = p.value_proj_l1(l);
        let kv = p.kv(l);
        let input = ScoreInput {
            stats: &stats,
            kv: Some(kv),
            query_moments: Some(&moments),
            value_proj_l1: Some(&proj),
            budget,
            layer: l,
        };
        scores.push(scorer.score(&input).unwrap());
        layers.push(Layer { stats });
    }
    (layers, scores)
}

fn uniform_kept(scores: &[Scores], budget: usize, protect: Protect) -> Kept {
    scores.iter().map(|s| select_heads(s, &vec![budget; s.kv_heads], protect).unwrap()).collect()
}

fn ours(p: &mut Peers, case: &Value, tie_scores: &mut Option<Vec<Scores>>) -> Kept {
    let method = case["method"].as_str().unwrap();
    let n = p.len;
    match method {
        "snapkv"
        | "tova"
        | "knorm"
        | "h2o-kvpress"
        | "streaming-llm"
        | "expected-attention"
        | "expected-attention-nocov"
        | "critical-snapkv"
        | "keydiff"
        | "lagkv"
        | "finch"
        | "cur" => {
            let b = n_kept(n, f(case, "compression_ratio"));
            let (scorer, window): (Box<dyn Scorer>, usize) = match method {
                "snapkv" => {
                    let w = u(case, "window");
                    (Box::new(SnapKv::new(w, Pooling::Avg(u(case, "kernel")), GroupReduce::Mean).unwrap()), w)
                }
                "finch" => {
                    let w = u(case, "window");
                    let normalize = case["params"]["normalize"].as_bool().unwrap();
                    (Box::new(Finch::new(w, normalize, false).unwrap()), w)
                }
                "tova" => (Box::new(Tova), 1),
                "knorm" => (Box::new(Knorm), 1),
                "keydiff" => (Box::new(KeyDiff), 1),
                "cur" => {
                    let leverage = match case["params"]["leverage_type"].as_str().unwrap() {
                        "key" => Leverage::Key,
                        "value" => Leverage::Value,
                        "kv_avg" => Leverage::KvAvg,
                        _ => Leverage::KvProduct,
                    };
                    let local = case["params"]["use_local_approximation"].as_bool().unwrap();
                    let w = local.then(|| u(case, "local_window_size"));
                    (Box::new(Cur::new(u(case, "num_sinks"), leverage, w).unwrap()), 1)
                }
                "lagkv" => {
                    let cross = case["params"]["cross_scoring"].as_bool().unwrap();
                    (Box::new(LagKv::new(u(case, "n_sink"), u(case, "lag_size"), cross).unwrap()), 1)
                }
                "h2o-kvpress" => (Box::new(H2o::kvpress()), 1),
                "streaming-llm" => (Box::new(StreamingLlm::new(u(case, "n_sink"))), 1),
                "expected-attention" | "expected-attention-nocov" => (
                    Box::new(
                        ExpectedAttention::with(
                            p.rope.clone(),
                            u(case, "n_future_positions"),
                            u(case, "n_sink"),
                            method == "expected-attention",
                            true,
                            0.0,
                        )
                        .unwrap(),
                    ),
                    1,
                ),
                _ => {
                    let w = u(case, "window");
                    let inner = SnapKv::new(w, Pooling::Avg(u(case, "kernel")), GroupReduce::Mean).unwrap();
                    (Box::new(CriticalKv::new(Box::new(inner))), w)
                }
            };
            let (_, scores) = score_layers(p, scorer.as_ref(), window, b);
            uniform_kept(&scores, b, scorer.protect(b))
        }
        "chunkkv-snapkv" | "chunkkv-keydiff" => {
            let c = u(case, "chunk_length");
            let (inner, window): (Box<dyn Scorer>, usize) = if method == "chunkkv-snapkv" {
                let w = u(case, "window");
                (Box::new(SnapKv::new(w, Pooling::Avg(u(case, "kernel")), GroupReduce::Mean).unwrap()), w)
            } else {
                (Box::new(KeyDiff), 1)
            };
            let scorer = ChunkKv::new(inner, c).unwrap();
            // kvpress keeps ⌊m·(1 − ratio)⌋ (at least 1) of the m chunks, the last one possibly
            // shorter; kvslice's budget counts tokens: it is given the tokens kvpress kept
            let m = n.div_ceil(c);
            let chunks = ((m as f64 * (1.0 - f(case, "compression_ratio"))) as usize).max(1);
            let theirs = peer_kept(case);
            (0..p.layers)
                .map(|l| {
                    let b = theirs[l][0].len();
                    assert!(b == chunks * c || b == (chunks - 1) * c + n % c, "{}: {b} tokens", case["name"]);
                    let stats = p.stats(l, window);
                    let kv = p.kv(l);
                    let input = ScoreInput { kv: Some(kv), ..ScoreInput::new(&stats, b) };
                    let s = scorer.score(&input).unwrap();
                    select_heads(&s, &vec![b; p.kv_heads], scorer.protect(b)).unwrap()
                })
                .collect()
        }
        "block-keydiff" => {
            let b = n_kept(n, f(case, "compression_ratio"));
            let scorer = Block::new(Box::new(KeyDiff), u(case, "block_size")).unwrap();
            let (_, scores) = score_layers(p, &scorer, 1, b);
            uniform_kept(&scores, b, scorer.protect(b))
        }
        "adakv-kvpress" => {
            let b = n_kept(n, f(case, "compression_ratio"));
            let w = u(case, "window");
            let scorer = SnapKv::new(w, Pooling::Avg(u(case, "kernel")), GroupReduce::Mean).unwrap();
            let (_, scores) = score_layers(p, &scorer, w, b);
            let ada = AdaKv::new(f(case, "alpha"), AdaMode::Kvpress, Box::new(Uniform)).unwrap();
            let protect = scorer.protect(b);
            scores.iter().map(|s| select_heads(s, &ada.head_budgets(s, b, protect), protect).unwrap()).collect()
        }
        "pyramidkv" => {
            let b = n_kept(n, f(case, "compression_ratio"));
            let w = u(case, "window");
            let scorer = SnapKv::new(w, Pooling::Avg(u(case, "kernel")), GroupReduce::Mean).unwrap();
            let (layers, scores) = score_layers(p, &scorer, w, b);
            let pyr = PyramidKv::new(f(case, "beta")).unwrap();
            let ls: Vec<LayerScores<'_>> =
                layers.iter().zip(&scores).map(|(l, s)| LayerScores { stats: &l.stats, scores: s }).collect();
            let budget = BudgetSpec::AveragePerLayer(b).resolve(n, p.layers, w).unwrap();
            let alloc = pyr.allocate(&ls, &budget, scorer.protect(b)).unwrap();
            let expected: Vec<usize> =
                case["layer_budgets"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            let got: Vec<usize> = alloc.budgets.iter().map(|h| h[0]).collect();
            assert_eq!(got, expected, "{}: layer budgets", case["name"]);
            alloc.select(&ls, scorer.protect(b)).unwrap()
        }
        "snapkv-original" => {
            let cap = u(case, "max_capacity_prompt");
            let w = u(case, "window");
            let scorer = SnapKv::new(w, Pooling::Max(u(case, "kernel")), GroupReduce::Mean).unwrap();
            let (_, scores) = score_layers(p, &scorer, w, cap);
            let kept = uniform_kept(&scores, cap, scorer.protect(cap));
            *tie_scores = Some(scores);
            kept
        }
        "adakv-original" => {
            let cap = u(case, "base_capacity");
            let w = u(case, "window");
            let scorer = SnapKv::new(w, Pooling::Max(u(case, "kernel")), GroupReduce::Mean).unwrap();
            let (_, scores) = score_layers(p, &scorer, w, cap);
            let ada = AdaKv::new(f(case, "alpha"), AdaMode::Original, Box::new(Uniform)).unwrap();
            let protect = scorer.protect(cap);
            let expected = case["head_budgets"].as_array().unwrap();
            let kept = scores
                .iter()
                .enumerate()
                .map(|(l, s)| {
                    let hb = ada.head_budgets(s, cap, protect);
                    let want: Vec<usize> =
                        expected[l].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
                    assert_eq!(hb, want, "{}: head budgets of layer {l}", case["name"]);
                    select_heads(s, &hb, protect).unwrap()
                })
                .collect();
            *tie_scores = Some(scores);
            kept
        }
        #[allow(clippy::needless_range_loop)]
        "cake" => {
            let w = u(case, "window");
            let cache = u(case, "cache_size");
            let scorer = CakeIndicator::new(w, f(case, "gamma") as f32, Pooling::Avg(5)).unwrap();
            let cake = Cake::new(f(case, "tau1"), f(case, "tau2")).unwrap();
            let (layers, scores) = score_layers(p, &scorer, w, cache);
            let protect = scorer.protect(cache);
            let expected: Vec<usize> =
                case["layer_budgets"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            if case["params"]["cascading"].as_bool().unwrap() {
                // stage by stage: trim the kept sets of layers 0..=m to the new budgets
                let mut cascade = CakeCascade::new(cake, p.layers, n, cache, w).unwrap();
                let mut kept: Kept = Vec::new();
                for (m, layer) in layers.iter().enumerate() {
                    let budgets = cascade.push(&layer.stats).to_vec();
                    kept.push(vec![(0..n as u32).collect(); p.kv_heads]);
                    for l in 0..=m {
                        for h in 0..p.kv_heads {
                            let cur = &kept[l][h];
                            let sub: Vec<f32> = cur.iter().map(|&j| scores[l].row(h)[j as usize]).collect();
                            let len = cur.len();
                            // the window is the tail of every kept list
                            let keep =
                                select_top_k(&sub, budgets[l], Protect { sinks: 0, recent: w.min(len) }).unwrap();
                            kept[l][h] = keep.iter().map(|&i| cur[i as usize]).collect();
                        }
                    }
                }
                let finals: Vec<usize> = kept.iter().map(|l| l[0].len()).collect();
                assert_eq!(finals, expected, "{}: final layer budgets", case["name"]);
                kept
            } else {
                let ls: Vec<LayerScores<'_>> =
                    layers.iter().zip(&scores).map(|(l, s)| LayerScores { stats: &l.stats, scores: s }).collect();
                let budget = BudgetSpec::AveragePerLayer(cache).resolve(n, p.layers, w).unwrap();
                let alloc = cake.allocate(&ls, &budget, protect).unwrap();
                let got: Vec<usize> = alloc.budgets.iter().map(|h| h[0]).collect();
                assert_eq!(got, expected, "{}: layer budgets", case["name"]);
                alloc.select(&ls, protect).unwrap()
            }
        }
        "leverage" => {
            let k = u(case, "sketch_dimension");
            let b = n_kept(n, f(case, "compression_ratio"));
            let scores: Vec<Scores> = (0..p.layers)
                .map(|l| {
                    let mut pre = p.keys[l].clone();
                    for (r, row) in pre.chunks_exact_mut(p.head_dim).enumerate() {
                        p.rope.unrotate(row, r % n);
                    }
                    // the press's `torch.randn(...) * (1 / math.sqrt(k))`, in f32
                    let scale = (1.0 / (k as f64).sqrt()) as f32;
                    let phi: Vec<f32> = p.leverage_sketch[l].iter().map(|&z| z * scale).collect();
                    // the press z-scores the table as a whole: one increasing map, the same top-k
                    let data = leverage_scores(&pre, p.kv_heads, n, p.head_dim, &phi, k).unwrap();
                    Scores { kv_heads: p.kv_heads, len: n, data }
                })
                .collect();
            let kept = uniform_kept(&scores, b, Protect::NONE);
            *tie_scores = Some(scores);
            kept
        }
        "non-causal-attn" => {
            let chunk = u(case, "chunk_size");
            let b = n_kept(n, f(case, "compression_ratio"));
            let scorer = NonCausalAttn::new(chunk).unwrap();
            let scores: Vec<Scores> = (0..p.layers)
                .map(|l| {
                    let mut stats = p.stats(l, 1);
                    stats.non_causal = vec![NonCausalTable {
                        spec: NonCausalSpec::whole(chunk),
                        sums: non_causal_sums(p.dims(), &p.q_rot[l], &p.keys[l], chunk).unwrap(),
                    }];
                    let kv = KvView { keys: None, ..p.kv(l) };
                    scorer.score(&ScoreInput { kv: Some(kv), ..ScoreInput::new(&stats, b) }).unwrap()
                })
                .collect();
            let kept = uniform_kept(&scores, b, scorer.protect(b));
            *tie_scores = Some(scores);
            kept
        }
        "compactor" => {
            let (sinks, recent, chunk, k) = (
                u(case, "sink_size_start"),
                u(case, "sink_size_end"),
                u(case, "chunk_size"),
                u(case, "sketch_dimension"),
            );
            let b = n_kept(n, f(case, "compression_ratio"));
            // `null`: the compression ratio, which the scorer derives from the budget
            let blend = case["params"]["blending"].as_f64();
            let scorer = Compactor::with(p.rope.clone(), k, 0, chunk, sinks, recent, blend).unwrap();
            let scale = (1.0 / (k as f64).sqrt()) as f32;
            let scores: Vec<Scores> = (0..p.layers)
                .map(|l| {
                    let mut stats = p.stats(l, 1);
                    let spec = scorer.spec();
                    let sums = non_causal_sums_over(p.dims(), &p.q_rot[l], &p.keys[l], spec).unwrap();
                    stats.non_causal = vec![NonCausalTable { spec, sums }];
                    let kv = p.kv(l);
                    let phi: Vec<f32> = p.leverage_sketch[l].iter().map(|&z| z * scale).collect();
                    scorer.score_with(&ScoreInput { kv: Some(kv), ..ScoreInput::new(&stats, b) }, &phi).unwrap()
                })
                .collect();
            let kept = uniform_kept(&scores, b, scorer.protect(b));
            *tie_scores = Some(scores);
            kept
        }
        "simlayerkv" => {
            assert_eq!(u(case, "n_last"), 1, "kvslice's test reads the last query");
            let lazy = Laziness::new(f(case, "lazy_threshold"), u(case, "n_initial"), u(case, "n_recent")).unwrap();
            // kvpress keeps every entry of the busy layers: a budget of the whole prompt
            let scorer = SimLayer::new(Box::new(Tova), lazy);
            let protect = scorer.protect(n);
            let stats: Vec<_> = (0..p.layers).map(|l| p.stats(l, 1)).collect();
            let scores: Vec<Scores> = stats.iter().map(|s| scorer.score(&ScoreInput::new(s, n)).unwrap()).collect();
            let ls: Vec<LayerScores<'_>> =
                stats.iter().zip(&scores).map(|(stats, scores)| LayerScores { stats, scores }).collect();
            let budget = BudgetSpec::AveragePerLayer(n).resolve(n, p.layers, protect.count(n)).unwrap();
            let alloc = SimLayerBudget::new(lazy).allocate(&ls, &budget, protect).unwrap();
            alloc.select(&ls, protect).unwrap()
        }
        "kvzip" => {
            // the first `ctx` positions are the context, the rest the reconstruction tokens
            let ctx = u(case, "context");
            let (h, hk, d) = (p.heads, p.kv_heads, p.head_dim);
            let r = n - ctx;
            let chunks: Vec<(usize, usize)> = case["params"]["chunks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| (c[0].as_u64().unwrap() as usize, c[1].as_u64().unwrap() as usize))
                .collect();
            let scorer = Kvzip::new(u(case, "n_sink"));
            let stats: Vec<WindowStats> = (0..p.layers)
                .map(|l| {
                    let q: Vec<f32> =
                        (0..h).flat_map(|hh| p.q_rot[l][(hh * n + ctx) * d..(hh + 1) * n * d].to_vec()).collect();
                    let mut table = vec![0.0f32; hk * ctx];
                    for &(start, end) in &chunks {
                        let got = reconstruction_scores(p.dims(), &q, &p.keys[l], r, 4, start..end).unwrap();
                        for kh in 0..hk {
                            table[kh * ctx + start..kh * ctx + end]
                                .copy_from_slice(&got[kh * (end - start)..(kh + 1) * (end - start)]);
                        }
                    }
                    WindowStats {
                        heads: h,
                        kv_heads: hk,
                        len: ctx,
                        window: 1,
                        mean: vec![0.0; h * ctx],
                        var: vec![0.0; h * ctx],
                        last: vec![0.0; h * ctx],
                        entropy: vec![0.0; h],
                        reconstruction: Some(table),
                        ..WindowStats::default()
                    }
                })
                .collect();
            let b = n_kept(ctx, f(case, "compression_ratio"));
            let scores: Vec<Scores> = stats.iter().map(|s| scorer.score(&ScoreInput::new(s, b)).unwrap()).collect();
            let protect = scorer.protect(b);
            let ls: Vec<LayerScores<'_>> =
                stats.iter().zip(&scores).map(|(stats, scores)| LayerScores { stats, scores }).collect();
            let budget = BudgetSpec::AveragePerLayer(b).resolve(ctx, p.layers, protect.count(ctx)).unwrap();
            let global = Global::new(!case["params"]["layerwise"].as_bool().unwrap());
            let alloc = global.allocate(&ls, &budget, protect).unwrap();
            alloc.select(&ls, protect).unwrap()
        }
        other => panic!("no Rust counterpart for peer method {other}"),
    }
}

#[test]
fn kept_sets_match_the_peers() {
    let mut p = Peers::load();
    let cases = p.cases.clone();
    assert!(cases.len() >= 76, "stored cases");
    let (mut sets, mut exact, mut worst, mut tied) = (0usize, 0usize, 0f64, 0usize);
    let mut failures = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let theirs = peer_kept(case);
        let mut tie_scores = None;
        let mine = ours(&mut p, case, &mut tie_scores);
        assert_eq!(mine.len(), theirs.len(), "{name}: layers");
        let (mut case_exact, mut case_sets, mut case_worst, mut case_tied) = (0, 0, 0f64, 0);
        for (l, (ml, tl)) in mine.iter().zip(&theirs).enumerate() {
            for (h, (m, t)) in ml.iter().zip(tl).enumerate() {
                case_sets += 1;
                let d = jaccard_distance(m, t);
                case_worst = case_worst.max(d);
                if m == t {
                    case_exact += 1;
                } else if let Some(sc) = &tie_scores {
                    // max pooling makes plateaus of equal scores; torch's top-k breaks those
                    // ties in no specified order, ours takes the lower position. The sets are
                    // then equivalent when the kept scores are the same multiset.
                    if m.len() == t.len() && same_scores(sc[l].row(h), m, t) {
                        case_tied += 1;
                    }
                }
            }
        }
        println!(
            "{name:40} {case_exact:2}/{case_sets:2} sets identical, {case_tied} equal up to tied scores, worst Jaccard distance {case_worst:.4}"
        );
        sets += case_sets;
        exact += case_exact;
        tied += case_tied;
        worst = worst.max(case_worst);
        if case_exact + case_tied != case_sets {
            failures
                .push(format!("{name}: {case_exact}/{case_sets} identical, worst Jaccard distance {case_worst:.4}"));
        }
    }
    println!(
        "total: {exact}/{sets} kept sets identical, {tied} more equal up to tied scores (max pooling), across {} cases; worst Jaccard distance {worst:.4}",
        cases.len()
    );
    assert!(failures.is_empty(), "kept sets differ from the peers:\n{}", failures.join("\n"));
}

/// Whether the scores kept by `a` and `b` form the same multiset (the sets differ only by
/// positions of equal score).
fn same_scores(row: &[f32], a: &[u32], b: &[u32]) -> bool {
    let sorted = |s: &[u32]| {
        let mut v: Vec<f32> = s.iter().map(|&j| row[j as usize]).collect();
        v.sort_by(|x, y| y.total_cmp(x));
        v
    };
    sorted(a).iter().zip(sorted(b)).all(|(x, y)| (x - y).abs() <= 1e-6 * x.abs().max(y.abs()))
}
