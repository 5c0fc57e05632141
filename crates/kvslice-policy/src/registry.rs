//! Policies by name: what the CLI lists (`kvslice policies`) and the conformance tests loop over.

use crate::alloc::{AdaKv, AdaMode, Allocator, Cake, LayerScores, PyramidKv, Uniform};
use crate::budget::{BudgetSpec, ResolvedBudget};
use crate::error::{PolicyError, Result};
use crate::ladder::Ladder;
use crate::scorer::{
    AnDPro, CakeIndicator, CounterCausal, CriticalKv, ExpectedAttention, H2o, Inertia, Jacap, Knorm, Rope, Scorer,
    SnapKv, Span, StreamingLlm, Temporal, Tova, TwinKv, TwinRepair,
};
use crate::select::Protect;
use crate::stats::{KvView, Needs, QueryMoments, ScoreInput, Scores, WindowStats};

/// What a policy may need to know about the model to be built.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelInfo {
    /// Head dimension `d`.
    pub head_dim: usize,
    /// RoPE base θ.
    pub rope_theta: f64,
}

/// A complete eviction policy.
#[derive(Debug)]
pub enum Policy {
    /// A scorer whose scores an allocator turns into budgets and the shared selection into kept
    /// positions.
    Scored {
        /// The per-token score.
        scorer: Box<dyn Scorer>,
        /// The split of the budget over layers and heads.
        allocator: Box<dyn Allocator>,
        /// TwinKV's repair pass over the selection, when composed.
        repair: Option<TwinRepair>,
    },
    /// A position rule without scores (LaCache's ladder).
    Ladder(Ladder),
}

/// One layer's inputs to [`Policy::plan`].
#[derive(Debug, Clone, Copy)]
pub struct LayerInput<'a> {
    /// Window statistics (always present; position-only policies read only the shapes).
    pub stats: &'a WindowStats,
    /// Cached K/V, when the policy needs them.
    pub kv: Option<KvView<'a>>,
    /// Pre-RoPE query moments, when the policy needs them.
    pub query_moments: Option<&'a QueryMoments>,
    /// `[H, n]` output-projected value norms, when the policy needs them.
    pub value_proj_l1: Option<&'a [f32]>,
}

impl<'a> LayerInput<'a> {
    /// A layer with window statistics only.
    pub fn new(stats: &'a WindowStats) -> Self {
        LayerInput { stats, kv: None, query_moments: None, value_proj_l1: None }
    }
}

/// The outcome of a policy on a prompt: budgets and kept positions per layer and KV head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The resolved budget.
    pub budget: ResolvedBudget,
    /// `[L][H_kv]` kept counts.
    pub budgets: Vec<Vec<usize>>,
    /// `[L][H_kv]` kept positions, sorted ascending.
    pub kept: Vec<Vec<Vec<u32>>>,
}

impl Policy {
    /// The inputs the runtime must produce.
    pub fn needs(&self) -> Needs {
        match self {
            Policy::Scored { scorer, repair, .. } => {
                let needs = scorer.needs();
                match repair {
                    Some(r) => needs.union(r.needs()),
                    None => needs,
                }
            }
            Policy::Ladder(_) => Needs::default(),
        }
    }

    /// The temporal rule of a decode-time scorer (InertiaKV), if any.
    pub fn temporal(&self) -> Option<Temporal> {
        match self {
            Policy::Scored { scorer, .. } => scorer.temporal(),
            Policy::Ladder(_) => None,
        }
    }

    /// The layers whose counter-causal pass the runtime runs (none unless the scorer needs it).
    pub fn counter_causal_layers(&self, layers: usize) -> Vec<usize> {
        match self {
            Policy::Scored { scorer, .. } if scorer.needs().counter_causal => scorer.counter_causal_layers(layers),
            _ => Vec::new(),
        }
    }

    /// Positions kept regardless of scores when each head keeps `budget` tokens.
    pub fn protect(&self, budget: usize) -> Protect {
        match self {
            Policy::Scored { scorer, .. } => scorer.protect(budget),
            Policy::Ladder(l) => Protect { sinks: l.sinks(), recent: 0 },
        }
    }

    /// Scores of one layer (scored policies only; `None` for position rules).
    pub fn score_layer(&self, layer: &LayerInput<'_>, budget: usize) -> Result<Option<Scores>> {
        match self {
            Policy::Scored { scorer, .. } => {
                let input = ScoreInput {
                    stats: layer.stats,
                    kv: layer.kv,
                    query_moments: layer.query_moments,
                    value_proj_l1: layer.value_proj_l1,
                    budget,
                };
                scorer.score(&input).map(Some)
            }
            Policy::Ladder(_) => Ok(None),
        }
    }

    /// Runs the whole policy on a prefilled prompt (one-shot; see [`crate::alloc::CakeCascade`]
    /// for CAKE's layer-by-layer form).
    pub fn plan(&self, layers: &[LayerInput<'_>], spec: &BudgetSpec) -> Result<Plan> {
        let first = layers.first().ok_or(PolicyError::ShapeMismatch { what: "layers", expected: 1, got: 0 })?;
        let n = first.stats.len;
        // the protected set may depend on the budget (H2O's recent share): resolve once without it
        let rough = spec.resolve(n, layers.len(), 0)?;
        let protect = self.protect(rough.per_layer);
        let budget = spec.resolve(n, layers.len(), protect.count(n))?;
        match self {
            Policy::Scored { allocator, repair, .. } => {
                let scores = layers
                    .iter()
                    .map(|l| Ok(self.score_layer(l, budget.per_layer)?.expect("scored policy")))
                    .collect::<Result<Vec<_>>>()?;
                let ls: Vec<LayerScores<'_>> =
                    layers.iter().zip(&scores).map(|(l, s)| LayerScores { stats: l.stats, scores: s }).collect();
                let alloc = allocator.allocate(&ls, &budget, protect)?;
                let mut kept = alloc.select(&ls, protect)?;
                if let Some(r) = repair {
                    for (l, layer) in kept.iter_mut().enumerate() {
                        for (h, head) in layer.iter_mut().enumerate() {
                            *head = r.repair_head(layers[l].stats, h, scores[l].row(h), head, protect)?.0;
                        }
                    }
                }
                Ok(Plan { budget, budgets: alloc.budgets, kept })
            }
            Policy::Ladder(ladder) => {
                let plan = ladder.compact(layers.len(), n, budget.per_layer, ladder.sinks());
                let kept: Vec<Vec<Vec<u32>>> =
                    layers.iter().zip(plan.kept).map(|(l, k)| vec![k; l.stats.kv_heads]).collect();
                let budgets = kept.iter().map(|l| l.iter().map(Vec::len).collect()).collect();
                Ok(Plan { budget, budgets, kept })
            }
        }
    }
}

/// A registered policy.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Name used on the command line.
    pub name: &'static str,
    /// The paper it implements.
    pub paper: &'static str,
    /// One line on what it keeps.
    pub summary: &'static str,
    build: fn(&ModelInfo) -> Result<Policy>,
}

impl Entry {
    /// Builds the policy with its default parameters.
    pub fn build(&self, model: &ModelInfo) -> Result<Policy> {
        (self.build)(model)
    }
}

fn scored(scorer: impl Scorer + 'static, allocator: impl Allocator + 'static) -> Result<Policy> {
    Ok(Policy::Scored { scorer: Box::new(scorer), allocator: Box::new(allocator), repair: None })
}

fn repaired(scorer: impl Scorer + 'static, allocator: impl Allocator + 'static) -> Result<Policy> {
    Ok(Policy::Scored { scorer: Box::new(scorer), allocator: Box::new(allocator), repair: Some(TwinRepair::default()) })
}

static REGISTRY: &[Entry] = &[
    Entry {
        name: "streaming-llm",
        paper: "Xiao et al. 2024, Efficient Streaming Language Models with Attention Sinks (arXiv:2309.17453)",
        summary: "4 attention sinks + the most recent tokens",
        build: |_| scored(StreamingLlm::default(), Uniform),
    },
    Entry {
        name: "h2o",
        paper: "Zhang et al. 2023, H2O: Heavy-Hitter Oracle (arXiv:2306.14048)",
        summary: "accumulated attention heavy hitters + recent half of the budget",
        build: |_| scored(H2o::default(), Uniform),
    },
    Entry {
        name: "snapkv",
        paper: "Li et al. 2024, SnapKV: LLM Knows What You are Looking for Before Generation (arXiv:2404.14469)",
        summary: "window-mean attention, avg-pool 5, window 64 (kvpress defaults)",
        build: |_| scored(SnapKv::default(), Uniform),
    },
    Entry {
        name: "snapkv-original",
        paper: "Li et al. 2024, SnapKV (arXiv:2404.14469), the paper's settings",
        summary: "window-mean attention, max-pool 7, window 32",
        build: |_| scored(SnapKv::original(), Uniform),
    },
    Entry {
        name: "tova",
        paper: "Oren et al. 2024, Transformers are Multi-State RNNs (arXiv:2401.06104)",
        summary: "last query's attention averaged over heads",
        build: |_| scored(Tova, Uniform),
    },
    Entry {
        name: "knorm",
        paper: "Devoto et al. 2024, A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression (arXiv:2406.11430)",
        summary: "keys with the smallest norm",
        build: |_| scored(Knorm, Uniform),
    },
    Entry {
        name: "expected-attention",
        paper: "Devoto et al. 2025, Expected Attention: KV Cache Compression by Estimating Attention from Future Queries Distribution (arXiv:2510.00636)",
        summary: "attention expected from the queries' mean/covariance, RoPE averaged over 512 next positions, times ‖v‖",
        build: |m| scored(ExpectedAttention::new(Rope::llama(m.rope_theta, m.head_dim)?), Uniform),
    },
    Entry {
        name: "andpro",
        paper: "Geng et al. 2025, Accurate KV Cache Eviction via Anchor Direction Projection (NeurIPS 2025)",
        summary: "attention-weighted projection of values on the pre-eviction output",
        build: |_| scored(AnDPro::default(), Uniform),
    },
    Entry {
        name: "critical-snapkv",
        paper: "Feng et al. 2025, Identify Critical KV Cache in LLM Inference from an Output Perturbation Perspective (arXiv:2502.03805)",
        summary: "SnapKV, half the budget by score, the rest by score × ‖v·W_o‖₁",
        build: |_| {
            Ok(Policy::Scored {
                scorer: Box::new(CriticalKv::new(Box::new(SnapKv::default()))),
                allocator: Box::new(Uniform),
                repair: None,
            })
        },
    },
    Entry {
        name: "counter-causal",
        paper: "counter-causal attention pass over the cached K/V (this crate's definition)",
        summary: "attention each token receives from earlier tokens looking forward",
        build: |_| scored(CounterCausal::default(), Uniform),
    },
    Entry {
        name: "counter-causal-fast",
        paper: "counter-causal attention pass (this crate's definition), the fast variant",
        summary: "one counter-causal pass on the last layer, its scores shared by every layer",
        build: |_| scored(CounterCausal::new(4, 32, true), Uniform),
    },
    Entry {
        name: "pyramidkv",
        paper: "Cai et al. 2024, PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling (arXiv:2406.02069)",
        summary: "SnapKV scores, linearly decreasing layer budgets (β = 20)",
        build: |_| scored(SnapKv::default(), PyramidKv::default()),
    },
    Entry {
        name: "cake",
        paper: "Qin et al. 2025, CAKE: Cascading and Adaptive KV Cache Eviction with Layer Preferences (ICLR 2025)",
        summary: "mean + 200·variance indicator, layer budgets ∝ entropy^(1/τ1)·variance^(1/τ2)",
        build: |_| scored(CakeIndicator::default(), Cake::default()),
    },
    Entry {
        name: "adakv",
        paper: "Feng et al. 2024, Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation (arXiv:2407.11550)",
        summary: "SnapKV (paper settings), head budgets from the layer-wide top-k, α = 0.2",
        build: |_| scored(SnapKv::original(), AdaKv::default()),
    },
    Entry {
        name: "adakv-kvpress",
        paper: "Feng et al. 2024, Ada-KV (arXiv:2407.11550), kvpress's AdaKVPress variant",
        summary: "SnapKV (kvpress defaults), per-head safeguard α = 0.2 then layer-wide top-k",
        build: |_| scored(SnapKv::default(), AdaKv::new(0.2, AdaMode::Kvpress, Box::new(Uniform))?),
    },
    Entry {
        name: "snapkv-span",
        paper: "SnapKV (arXiv:2404.14469) with whole spans kept: each token scores the best of the 12 before it (kvslice)",
        summary: "SnapKV scores dilated over spans, so a kept key phrase keeps the value after it",
        build: |_| scored(Span::new(Box::new(SnapKv::default())), Uniform),
    },
    Entry {
        name: "adakv-span",
        paper: "Ada-KV (arXiv:2407.11550) over span-dilated SnapKV scores (kvslice)",
        summary: "Ada-KV head budgets over SnapKV scores dilated over spans",
        build: |_| scored(Span::new(Box::new(SnapKv::default())), AdaKv::default()),
    },
    Entry {
        name: "twinkv",
        paper: "Chen et al. 2026, TwinKV: A Composable Repair Pass for KV Cache Eviction via Pairwise Key Redundancy (arXiv:2608.27128)",
        summary: "attention-free: keys without a near-duplicate (cosine) outside ±8 positions kept first",
        build: |_| scored(TwinKv::default(), Uniform),
    },
    Entry {
        name: "snapkv-twin",
        paper: "SnapKV (arXiv:2404.14469) + TwinKV's repair pass (arXiv:2608.27128)",
        summary: "SnapKV, then evicted tokens without a surviving twin swapped for kept redundant ones (τ = 0.85)",
        build: |_| repaired(SnapKv::default(), Uniform),
    },
    Entry {
        name: "adakv-twin",
        paper: "Ada-KV (arXiv:2407.11550) + TwinKV's repair pass (arXiv:2608.27128)",
        summary: "Ada-KV head budgets over SnapKV, then TwinKV's repair per head",
        build: |_| repaired(SnapKv::original(), AdaKv::default()),
    },
    Entry {
        name: "inertiakv",
        paper: "Zeng et al. 2026, What Matters for Aggressive Decoding-Time KV Eviction? Temporal Aggregation and Ranking Preservation (arXiv:2609.03515)",
        summary: "fixed cache while decoding: lowest EMA (α = 0.8) of each step's head-averaged attention goes",
        build: |_| scored(Inertia::every_step(), Uniform),
    },
    Entry {
        name: "inertiakv-lazy",
        paper: "InertiaKV-Lazy (arXiv:2609.03515)",
        summary: "InertiaKV with scores refreshed every 4 decode steps",
        build: |_| scored(Inertia::lazy(), Uniform),
    },
    Entry {
        name: "inertiakv-score-free",
        paper: "InertiaKV's score-free decoding (arXiv:2609.03515)",
        summary: "the prompt's ranking scored once (last prompt query) and frozen while decoding",
        build: |_| scored(Inertia::score_free(), Uniform),
    },
    Entry {
        name: "jacap",
        paper: "Jacap: eviction from a first-order (Jacobian) view of attention, with key leverage scores (kvslice's realisation)",
        summary: "ridge leverage of the keys weighted by ‖∂o/∂s_j‖ = a_j‖v_j − o‖ over a 32-query window",
        build: |_| scored(Jacap::default(), Uniform),
    },
    Entry {
        name: "jacap-span",
        paper: "Jacap with whole spans kept: each token scores the best leverage of the 12 before it (kvslice)",
        summary: "Jacap's leverage dilated over spans, as snapkv-span does for SnapKV",
        build: |_| scored(Span::new(Box::new(Jacap::default())), Uniform),
    },
    Entry {
        name: "twinkv-span",
        paper: "TwinKV (arXiv:2608.27128) on its own, with whole spans kept (kvslice)",
        summary: "key uniqueness dilated over spans: a unique token keeps the 12 after it",
        build: |_| scored(Span::new(Box::new(TwinKv::default())), Uniform),
    },
    Entry {
        name: "snapkv-span-twin",
        paper: "snapkv-span + TwinKV's repair pass (arXiv:2608.27128)",
        summary: "span-dilated SnapKV, then TwinKV's repair",
        build: |_| repaired(Span::new(Box::new(SnapKv::default())), Uniform),
    },
    Entry {
        name: "lacache",
        paper: "Shi et al. 2025, LaCache: Ladder-Shaped KV Caching for Efficient Long-Context Modeling (arXiv:2507.14204)",
        summary: "ladder of positions across layers (span 16, overlap 0, 4 sinks), iterative compaction",
        build: |_| Ok(Policy::Ladder(Ladder::default())),
    },
];

/// Every registered policy, in listing order.
pub fn registry() -> &'static [Entry] {
    REGISTRY
}

/// The entry named `name`.
pub fn lookup(name: &str) -> Result<&'static Entry> {
    REGISTRY.iter().find(|e| e.name == name).ok_or_else(|| PolicyError::UnknownPolicy {
        name: name.to_string(),
        known: REGISTRY.iter().map(|e| e.name).collect::<Vec<_>>().join(", "),
    })
}

/// Builds the policy named `name` with its defaults.
pub fn build(name: &str, model: &ModelInfo) -> Result<Policy> {
    lookup(name)?.build(model)
}

/// One line per policy: `name — paper`, for `kvslice policies`.
pub fn listing() -> String {
    let width = REGISTRY.iter().map(|e| e.name.len()).max().unwrap_or(0);
    REGISTRY.iter().map(|e| format!("{:width$}  {} — {}\n", e.name, e.summary, e.paper)).collect()
}
