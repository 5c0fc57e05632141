//! Policies by name: what the CLI lists (`kvslice policies`) and the conformance tests loop over.
//!
//! An entry is a complete description of a policy: its prefill selection (scorer, allocator,
//! repair), its decode-time behaviour ([`DecodeSpec`]) and its options, given on the command
//! line as `name:key=value,…` ([`build_spec`]) and checked against what the entry declares
//! ([`Entry::options`]).

use crate::alloc::{AdaKv, AdaMode, Allocator, Cake, Global, LayerScores, PyramidKv, Uniform};
use crate::budget::{BudgetSpec, ResolvedBudget};
use crate::decode::{DecodeRule, DecodeSpec};
use crate::error::{PolicyError, Result};
use crate::ladder::Ladder;
use crate::options::{OptionKind, OptionSpec, Options, PolicySpec};
use crate::pool::Pooling;
use crate::scorer::simlayer::{Laziness, SimLayer, SimLayerBudget};
use crate::scorer::{
    AnDPro, Block, CakeIndicator, ChunkKv, Compactor, CounterCausal, CriticalKv, Cur, DistillCache, ExpectedAttention,
    Finch, H2o, Inertia, Jacap, KeyDiff, Knorm, Kvzip, LagKv, Leverage, LeverageScore, NonCausalAttn, Random, Refresh,
    Rope, Scorer, SnapKv, Span, StreamingLlm, Temporal, Tova, TwinKv, TwinRepair,
};
use crate::select::Protect;
use crate::stats::{GroupReduce, KvView, Needs, QueryMoments, ScoreInput, Scores, WindowStats};

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
        /// What the cache does while decoding.
        decode: DecodeSpec,
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
    /// The layer's index in the model ([`Policy::plan`] sets it from the layer's place in its
    /// slice).
    pub layer: usize,
}

impl<'a> LayerInput<'a> {
    /// Layer 0 with window statistics only (see [`LayerInput::at`]).
    pub fn new(stats: &'a WindowStats) -> Self {
        LayerInput { stats, kv: None, query_moments: None, value_proj_l1: None, layer: 0 }
    }

    /// The same input for layer `layer`.
    pub fn at(self, layer: usize) -> Self {
        LayerInput { layer, ..self }
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

    /// The policy's declared decode behaviour.
    pub fn decode_spec(&self) -> DecodeSpec {
        match self {
            Policy::Scored { decode, .. } => decode.clone(),
            Policy::Ladder(l) => DecodeSpec::Ladder(*l),
        }
    }

    /// The decode behaviour at a budget of `per_layer` tokens per KV head: the protected
    /// positions at that budget fill in the sinks (StreamingLLM), the recent window (H2O) and
    /// the indicator's window (CAKE, at least 2).
    pub fn decode_rule(&self, per_layer: usize) -> DecodeRule {
        let p = self.protect(per_layer);
        match self.decode_spec() {
            DecodeSpec::Grow => DecodeRule::Grow,
            DecodeSpec::Recent => DecodeRule::Recent { sinks: p.sinks },
            DecodeSpec::Accumulated => DecodeRule::Accumulated { recent: p.recent },
            DecodeSpec::LastQuery => DecodeRule::LastQuery,
            DecodeSpec::Indicator { gamma } => DecodeRule::Indicator { window: p.recent.max(2), gamma },
            DecodeSpec::Inertia(t) => DecodeRule::Inertia(t),
            DecodeSpec::Recompress { every } => DecodeRule::Recompress { every },
            DecodeSpec::Ladder(l) => DecodeRule::Ladder(l),
        }
    }

    /// CAKE's allocator parameters when the policy's layer budgets are CAKE's, whose
    /// layer-by-layer cascade ([`crate::alloc::CakeCascade`]) the runtime runs; `None` otherwise.
    pub fn cascade(&self) -> Option<Cake> {
        match self {
            Policy::Scored { allocator, .. } => allocator.cascade(),
            Policy::Ladder(_) => None,
        }
    }

    /// Whether the runtime renumbers the kept keys after the selection
    /// ([`Scorer::rerotates_keys`]).
    pub fn rerotates_keys(&self) -> bool {
        match self {
            Policy::Scored { scorer, .. } => scorer.rerotates_keys(),
            Policy::Ladder(_) => false,
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
                    layer: layer.layer,
                };
                scorer.score(&input).map(Some)
            }
            Policy::Ladder(_) => Ok(None),
        }
    }

    /// Runs the whole policy on a prefilled prompt (one-shot; see [`crate::alloc::CakeCascade`]
    /// for CAKE's layer-by-layer form).
    pub fn plan(&self, layers: &[LayerInput<'_>], spec: &BudgetSpec) -> Result<Plan> {
        self.plan_grouped(layers, spec, None)
    }

    /// [`Policy::plan`] for a cache whose heads share slots in groups (`groups[l]`: layer
    /// `l`'s groups of KV heads): each layer's scores are pooled over every group
    /// ([`Scores::pool_groups`]) before the budgets are allocated and the entries selected, so
    /// the policy's own structure (spans, pooling, protected positions) shapes one set per group.
    pub fn plan_grouped(
        &self,
        layers: &[LayerInput<'_>],
        spec: &BudgetSpec,
        groups: Option<&[Vec<Vec<usize>>]>,
    ) -> Result<Plan> {
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
                    .enumerate()
                    .map(|(i, l)| {
                        let mut s = self.score_layer(&l.at(i), budget.per_layer)?.expect("scored policy");
                        if let Some(g) = groups.and_then(|g| g.get(i)) {
                            s.pool_groups(g);
                        }
                        Ok(s)
                    })
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
    /// Its own options (the universal [`EVERY`] is added for scored policies).
    options: fn() -> Vec<OptionSpec>,
    /// Whether the policy is scored, and so takes [`EVERY`].
    scored: bool,
    build: fn(&Options, &ModelInfo) -> Result<Policy>,
}

/// The option every scored policy takes: `every=N` (N ≥ 1) re-scores the cache and compresses
/// it back to the budget every N decode steps ([`DecodeSpec::Recompress`]) instead of the
/// policy's own decode rule; 0 keeps the policy's rule.
pub const EVERY: OptionSpec = int(
    "every",
    "0",
    0,
    65536,
    "decode steps between re-scorings of the cache back to the budget; 0: the policy's own decode rule",
);

impl Entry {
    /// Builds the policy with its default parameters.
    pub fn build(&self, model: &ModelInfo) -> Result<Policy> {
        self.build_with(&self.parse_options(&[])?, model)
    }

    /// The options the policy takes, in listing order.
    pub fn options(&self) -> Vec<OptionSpec> {
        let mut o = (self.options)();
        if self.scored {
            o.push(EVERY);
        }
        o
    }

    /// Checks `(key, value)` pairs against [`Entry::options`]: an undeclared key is
    /// [`PolicyError::UnknownOption`]; a key given twice or a value that does not parse or lies
    /// outside its range is [`PolicyError::InvalidOption`]. The constructors' own checks run in
    /// [`Entry::build_with`].
    pub fn parse_options(&self, given: &[(String, String)]) -> Result<Options> {
        Options::parse(self.name, self.options(), given)
    }

    /// Builds the policy with `options` (from [`Entry::parse_options`]). A value the policy's
    /// constructor refuses (an even pooling kernel, H2O's recent share of 1, …) is
    /// [`PolicyError::InvalidOption`].
    pub fn build_with(&self, options: &Options, model: &ModelInfo) -> Result<Policy> {
        if options.policy() != self.name {
            return Err(
                options.invalid(options.to_string(), format!("options of {} given to {}", options.policy(), self.name))
            );
        }
        let given = options.to_string();
        let mut policy = (self.build)(options, model).map_err(|e| match e {
            PolicyError::InvalidParameter { method, name, reason } if !given.is_empty() && method != "rope" => {
                options.invalid(given.clone(), format!("{method}: parameter {name} {reason}"))
            }
            other => other,
        })?;
        if self.scored {
            let every = options.get_usize("every")?;
            if let (true, Policy::Scored { decode, .. }) = (every > 0, &mut policy) {
                *decode = DecodeSpec::Recompress { every };
            }
        }
        Ok(policy)
    }
}

const fn int(name: &'static str, default: &'static str, min: i64, max: i64, help: &'static str) -> OptionSpec {
    OptionSpec { name, default, help, kind: OptionKind::Int { min, max } }
}

const fn float(name: &'static str, default: &'static str, min: f64, max: f64, help: &'static str) -> OptionSpec {
    OptionSpec { name, default, help, kind: OptionKind::Float { min, max } }
}

const fn boolean(name: &'static str, default: &'static str, help: &'static str) -> OptionSpec {
    OptionSpec { name, default, help, kind: OptionKind::Bool }
}

const fn choice(
    name: &'static str,
    default: &'static str,
    choices: &'static [&'static str],
    help: &'static str,
) -> OptionSpec {
    OptionSpec { name, default, help, kind: OptionKind::Choice(choices) }
}

const POOLS: &[&str] = &["avg", "max", "none"];

fn window(default: &'static str) -> OptionSpec {
    int("window", default, 1, 4096, "observation window: the last `window` queries score the prefix and are kept")
}

fn kernel(default: &'static str) -> OptionSpec {
    int("kernel", default, 1, 63, "pooling kernel over neighbouring positions (odd)")
}

fn pool(default: &'static str) -> OptionSpec {
    choice("pool", default, POOLS, "pooling of the scores over the kernel")
}

/// SnapKV's options with the given defaults.
fn snap(w: &'static str, k: &'static str, p: &'static str) -> Vec<OptionSpec> {
    vec![
        window(w),
        kernel(k),
        pool(p),
        choice("reduce", "mean", &["mean", "max"], "reduction of a GQA group's scores to its KV head"),
    ]
}

/// kvpress's SnapKV: w = 64, average pooling of 5.
fn snap_kvpress() -> Vec<OptionSpec> {
    snap("64", "5", "avg")
}

/// The paper's SnapKV: w = 32, max pooling of 7.
fn snap_paper() -> Vec<OptionSpec> {
    snap("32", "7", "max")
}

fn span_options() -> Vec<OptionSpec> {
    vec![
        int("span", "12", 0, 4096, "each token scores the best of the `span` tokens before it"),
        int("before", "2", 0, 4096, "each token also scores the best of the `before` tokens after it"),
    ]
}

fn twin_options() -> Vec<OptionSpec> {
    vec![
        float("tau", "0.85", -1.0, 1.0, "key cosine similarity from which two tokens are twins (above −1)"),
        float("max_swap", "0.25", 0.0, 1.0, "largest share of the unprotected budget the repair swaps"),
    ]
}

fn ada_options(mode: &'static str) -> Vec<OptionSpec> {
    vec![
        float("alpha", "0.2", 0.0, 1.0, "share of each head's base budget it keeps whatever the other heads score"),
        choice(
            "mode",
            mode,
            &["exact", "original", "kvpress"],
            "rounding: exact sum, the reference code's, or kvpress's safeguard then layer-wide top-k",
        ),
    ]
}

fn inertia_options(refresh: &'static str) -> Vec<OptionSpec> {
    vec![
        float("alpha", "0.8", 0.0, 1.0, "EMA weight of the past (below 1)"),
        int("refresh", refresh, 0, 65536, "decode steps between score refreshes; 0: never (score-free)"),
    ]
}

fn cake_options() -> Vec<OptionSpec> {
    vec![
        int("window", "32", 2, 4096, "observation window (at least 2: the variance needs two queries)"),
        float("gamma", "200", 0.0, 100_000.0, "weight of the attention variance in the indicator, prefill and decode"),
        kernel("5"),
        pool("avg"),
        float("tau1", "1", 0.01, 100.0, "temperature of the dispersion in the layer preference"),
        float("tau2", "1", 0.01, 100.0, "temperature of the shift in the layer preference"),
    ]
}

fn pooling(o: &Options) -> Result<Pooling> {
    let k = o.get_usize("kernel")?;
    Ok(match o.get_str("pool")? {
        "max" => Pooling::Max(k),
        "none" => Pooling::None,
        _ => Pooling::Avg(k),
    })
}

fn snapkv(o: &Options) -> Result<SnapKv> {
    let reduce = if o.get_str("reduce")? == "max" { GroupReduce::Max } else { GroupReduce::Mean };
    SnapKv::new(o.get_usize("window")?, pooling(o)?, reduce)
}

fn span(inner: impl Scorer + 'static, o: &Options) -> Result<Span> {
    Span::with(Box::new(inner), o.get_usize("before")?, o.get_usize("span")?)
}

fn distill_options() -> Vec<OptionSpec> {
    vec![
        OptionSpec {
            name: "weights",
            default: crate::scorer::distill::BUILTIN,
            help: "the networks: smollm2-135m (built in, trained for SmolLM2-135M) or a safetensors file from kvslice train-policy",
            kind: OptionKind::Text,
        },
        int("recent", "0", 0, 1 << 20, "the most recent entries always kept, beside the 4 sinks"),
    ]
}

fn distill(o: &Options) -> Result<DistillCache> {
    Ok(DistillCache::load(&o.get_text("weights")?)?.with_recent(o.get_usize("recent")?))
}

fn adakv(o: &Options) -> Result<AdaKv> {
    let mode = match o.get_str("mode")? {
        "original" => AdaMode::Original,
        "kvpress" => AdaMode::Kvpress,
        _ => AdaMode::ExactSum,
    };
    AdaKv::new(o.get_f64("alpha")?, mode, Box::new(Uniform))
}

fn twin_repair(o: &Options) -> Result<TwinRepair> {
    TwinRepair::new(o.get_f32("tau")?, o.get_f32("max_swap")?)
}

fn cake_indicator(o: &Options) -> Result<CakeIndicator> {
    CakeIndicator::new(o.get_usize("window")?, o.get_f32("gamma")?, pooling(o)?)
}

/// [`CakeIndicator::default`]: the `cake` options' defaults.
pub(crate) fn default_cake_indicator() -> CakeIndicator {
    Options::parse("cake", cake_options(), &[])
        .and_then(|o| cake_indicator(&o))
        .expect("the declared defaults of cake are valid")
}

fn inertia(o: &Options) -> Result<Policy> {
    let refresh = match o.get_usize("refresh")? {
        0 => Refresh::Never,
        r => Refresh::Every(r),
    };
    let scorer = Inertia::new(o.get_f32("alpha")?, refresh)?;
    let decode = scorer.temporal().map_or(DecodeSpec::Grow, DecodeSpec::Inertia);
    scored(scorer, Uniform, decode)
}

fn scored(scorer: impl Scorer + 'static, allocator: impl Allocator + 'static, decode: DecodeSpec) -> Result<Policy> {
    Ok(Policy::Scored { scorer: Box::new(scorer), allocator: Box::new(allocator), repair: None, decode })
}

fn repaired(scorer: impl Scorer + 'static, allocator: impl Allocator + 'static, repair: TwinRepair) -> Result<Policy> {
    Ok(Policy::Scored {
        scorer: Box::new(scorer),
        allocator: Box::new(allocator),
        repair: Some(repair),
        decode: DecodeSpec::Grow,
    })
}

static REGISTRY: &[Entry] = &[
    Entry {
        name: "streaming-llm",
        paper: "Xiao et al. 2024, Efficient Streaming Language Models with Attention Sinks (arXiv:2309.17453)",
        summary: "4 attention sinks + the most recent tokens",
        options: || vec![int("sinks", "4", 0, 4096, "initial tokens always kept (attention sinks)")],
        scored: true,
        build: |o, _| scored(StreamingLlm::new(o.get_usize("sinks")?), Uniform, DecodeSpec::Recent),
    },
    Entry {
        name: "h2o",
        paper: "Zhang et al. 2023, H2O: Heavy-Hitter Oracle (arXiv:2306.14048)",
        summary: "accumulated attention heavy hitters + recent half of the budget",
        options: || {
            vec![
                float("recent", "0.5", 0.0, 1.0, "share of the budget kept for the newest tokens (below 1)"),
                boolean("normalize", "false", "divide each sum by the number of queries that see the token (kvpress)"),
            ]
        },
        scored: true,
        build: |o, _| {
            scored(H2o::new(o.get_f32("recent")?, o.get_bool("normalize")?)?, Uniform, DecodeSpec::Accumulated)
        },
    },
    Entry {
        name: "snapkv",
        paper: "Li et al. 2024, SnapKV: LLM Knows What You are Looking for Before Generation (arXiv:2404.14469)",
        summary: "window-mean attention, avg-pool 5, window 64 (kvpress defaults)",
        options: snap_kvpress,
        scored: true,
        build: |o, _| scored(snapkv(o)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "snapkv-original",
        paper: "Li et al. 2024, SnapKV (arXiv:2404.14469), the paper's settings",
        summary: "window-mean attention, max-pool 7, window 32",
        options: snap_paper,
        scored: true,
        build: |o, _| scored(snapkv(o)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "tova",
        paper: "Oren et al. 2024, Transformers are Multi-State RNNs (arXiv:2401.06104)",
        summary: "last query's attention averaged over heads",
        options: Vec::new,
        scored: true,
        build: |_, _| scored(Tova, Uniform, DecodeSpec::LastQuery),
    },
    Entry {
        name: "knorm",
        paper: "Devoto et al. 2024, A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression (arXiv:2406.11430)",
        summary: "keys with the smallest norm",
        options: Vec::new,
        scored: true,
        build: |_, _| scored(Knorm, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "expected-attention",
        paper: "Devoto et al. 2025, Expected Attention: KV Cache Compression by Estimating Attention from Future Queries Distribution (arXiv:2510.00636)",
        summary: "attention expected from the queries' mean/covariance, RoPE averaged over 512 next positions, times ‖v‖",
        options: || {
            vec![
                int("future", "512", 1, 65536, "next positions the RoPE rotation is averaged over"),
                int("sinks", "4", 0, 4096, "initial tokens always kept and left out of the query statistics"),
                boolean("covariance", "true", "use the queries' covariance, not only their mean"),
                boolean("vnorm", "true", "multiply by the value norm"),
                float("epsilon", "0", 0.0, 1.0, "added to the expected attention before the value norm"),
            ]
        },
        scored: true,
        build: |o, m| {
            let scorer = ExpectedAttention::with(
                Rope::llama(m.rope_theta, m.head_dim)?,
                o.get_usize("future")?,
                o.get_usize("sinks")?,
                o.get_bool("covariance")?,
                o.get_bool("vnorm")?,
                o.get_f32("epsilon")?,
            )?;
            scored(scorer, Uniform, DecodeSpec::Grow)
        },
    },
    Entry {
        name: "andpro",
        paper: "Geng et al. 2025, Accurate KV Cache Eviction via Anchor Direction Projection (NeurIPS 2025)",
        summary: "attention-weighted projection of values on the pre-eviction output",
        options: || vec![window("32"), kernel("5"), pool("avg")],
        scored: true,
        build: |o, _| scored(AnDPro::new(o.get_usize("window")?, pooling(o)?)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "critical-snapkv",
        paper: "Feng et al. 2025, Identify Critical KV Cache in LLM Inference from an Output Perturbation Perspective (arXiv:2502.03805)",
        summary: "SnapKV, half the budget by score, the rest by score × ‖v·W_o‖₁",
        options: || {
            let mut o = snap_kvpress();
            o.push(float("epsilon", "0.0001", 0.0, 1.0, "added to the score before the value-norm weighting"));
            o.push(float("ratio", "0.5", 0.0, 1.0, "share of the budget chosen by the SnapKV score alone"));
            o
        },
        scored: true,
        build: |o, _| {
            let scorer = CriticalKv::with(Box::new(snapkv(o)?), o.get_f32("epsilon")?, o.get_f32("ratio")?)?;
            scored(scorer, Uniform, DecodeSpec::Grow)
        },
    },
    Entry {
        name: "counter-causal",
        paper: "counter-causal attention pass over the cached K/V (this crate's definition)",
        summary: "attention each token receives from earlier tokens looking forward",
        options: || counter_causal_options("false"),
        scored: true,
        build: |o, _| scored(counter_causal(o)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "counter-causal-fast",
        paper: "counter-causal attention pass (this crate's definition), the fast variant",
        summary: "one counter-causal pass on the last layer, its scores shared by every layer",
        options: || counter_causal_options("true"),
        scored: true,
        build: |o, _| scored(counter_causal(o)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "pyramidkv",
        paper: "Cai et al. 2024, PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling (arXiv:2406.02069)",
        summary: "SnapKV scores, linearly decreasing layer budgets (β = 20)",
        options: || {
            let mut o = snap_kvpress();
            o.push(float("beta", "20", 1.0, 1000.0, "steepness: the last layer keeps 1/beta of the average"));
            o
        },
        scored: true,
        build: |o, _| scored(snapkv(o)?, PyramidKv::new(o.get_f64("beta")?)?, DecodeSpec::Grow),
    },
    Entry {
        name: "cake",
        paper: "Qin et al. 2025, CAKE: Cascading and Adaptive KV Cache Eviction with Layer Preferences (ICLR 2025)",
        summary: "mean + 200·variance indicator, layer budgets ∝ entropy^(1/τ1)·variance^(1/τ2)",
        options: cake_options,
        scored: true,
        build: |o, _| {
            let indicator = cake_indicator(o)?;
            let decode = DecodeSpec::Indicator { gamma: indicator.gamma() };
            scored(indicator, Cake::new(o.get_f64("tau1")?, o.get_f64("tau2")?)?, decode)
        },
    },
    Entry {
        name: "adakv",
        paper: "Feng et al. 2024, Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation (arXiv:2407.11550)",
        summary: "SnapKV (paper settings), head budgets from the layer-wide top-k, α = 0.2",
        options: || [snap_paper(), ada_options("exact")].concat(),
        scored: true,
        build: |o, _| scored(snapkv(o)?, adakv(o)?, DecodeSpec::Grow),
    },
    Entry {
        name: "adakv-kvpress",
        paper: "Feng et al. 2024, Ada-KV (arXiv:2407.11550), kvpress's AdaKVPress variant",
        summary: "SnapKV (kvpress defaults), per-head safeguard α = 0.2 then layer-wide top-k",
        options: || [snap_kvpress(), ada_options("kvpress")].concat(),
        scored: true,
        build: |o, _| scored(snapkv(o)?, adakv(o)?, DecodeSpec::Grow),
    },
    Entry {
        name: "snapkv-span",
        paper: "SnapKV (arXiv:2404.14469) with whole spans kept: each token scores the best of the 12 before it (kvslice)",
        summary: "SnapKV scores dilated over spans, so a kept key phrase keeps the value after it",
        options: || [snap_kvpress(), span_options()].concat(),
        scored: true,
        build: |o, _| scored(span(snapkv(o)?, o)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "adakv-span",
        paper: "Ada-KV (arXiv:2407.11550) over span-dilated SnapKV scores (kvslice)",
        summary: "Ada-KV head budgets over SnapKV scores dilated over spans",
        options: || [snap_kvpress(), span_options(), ada_options("exact")].concat(),
        scored: true,
        build: |o, _| scored(span(snapkv(o)?, o)?, adakv(o)?, DecodeSpec::Grow),
    },
    Entry {
        name: "twinkv",
        paper: "Chen et al. 2026, TwinKV: A Composable Repair Pass for KV Cache Eviction via Pairwise Key Redundancy (arXiv:2608.27128)",
        summary: "attention-free: keys without a near-duplicate (cosine) outside ±8 positions kept first",
        options: twinkv_options,
        scored: true,
        build: |o, _| scored(twinkv(o)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "snapkv-twin",
        paper: "SnapKV (arXiv:2404.14469) + TwinKV's repair pass (arXiv:2608.27128)",
        summary: "SnapKV, then evicted tokens without a surviving twin swapped for kept redundant ones (τ = 0.85)",
        options: || [snap_kvpress(), twin_options()].concat(),
        scored: true,
        build: |o, _| repaired(snapkv(o)?, Uniform, twin_repair(o)?),
    },
    Entry {
        name: "adakv-twin",
        paper: "Ada-KV (arXiv:2407.11550) + TwinKV's repair pass (arXiv:2608.27128)",
        summary: "Ada-KV head budgets over SnapKV, then TwinKV's repair per head",
        options: || [snap_paper(), ada_options("exact"), twin_options()].concat(),
        scored: true,
        build: |o, _| repaired(snapkv(o)?, adakv(o)?, twin_repair(o)?),
    },
    Entry {
        name: "inertiakv",
        paper: "Zeng et al. 2026, What Matters for Aggressive Decoding-Time KV Eviction? Temporal Aggregation and Ranking Preservation (arXiv:2609.03515)",
        summary: "fixed cache while decoding: lowest EMA (α = 0.8) of each step's head-averaged attention goes",
        options: || inertia_options("1"),
        scored: true,
        build: |o, _| inertia(o),
    },
    Entry {
        name: "inertiakv-lazy",
        paper: "InertiaKV-Lazy (arXiv:2609.03515)",
        summary: "InertiaKV with scores refreshed every 4 decode steps",
        options: || inertia_options("4"),
        scored: true,
        build: |o, _| inertia(o),
    },
    Entry {
        name: "inertiakv-score-free",
        paper: "InertiaKV's score-free decoding (arXiv:2609.03515)",
        summary: "the prompt's ranking scored once (last prompt query) and frozen while decoding",
        options: || inertia_options("0"),
        scored: true,
        build: |o, _| inertia(o),
    },
    Entry {
        name: "jacap",
        paper: "Jacap: eviction from a first-order (Jacobian) view of attention, with key leverage scores (kvslice's realisation)",
        summary: "ridge leverage of the keys weighted by ‖∂o/∂s_j‖ = a_j‖v_j − o‖ over a 32-query window",
        options: || vec![window("32")],
        scored: true,
        build: |o, _| scored(Jacap::new(o.get_usize("window")?)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "jacap-span",
        paper: "Jacap with whole spans kept: each token scores the best leverage of the 12 before it (kvslice)",
        summary: "Jacap's leverage dilated over spans, as snapkv-span does for SnapKV",
        options: || [vec![window("32")], span_options()].concat(),
        scored: true,
        build: |o, _| scored(span(Jacap::new(o.get_usize("window")?)?, o)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "twinkv-span",
        paper: "TwinKV (arXiv:2608.27128) on its own, with whole spans kept (kvslice)",
        summary: "key uniqueness dilated over spans: a unique token keeps the 12 after it",
        options: || [twinkv_options(), span_options()].concat(),
        scored: true,
        build: |o, _| scored(span(twinkv(o)?, o)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "snapkv-span-twin",
        paper: "snapkv-span + TwinKV's repair pass (arXiv:2608.27128)",
        summary: "span-dilated SnapKV, then TwinKV's repair",
        options: || [snap_kvpress(), span_options(), twin_options()].concat(),
        scored: true,
        build: |o, _| repaired(span(snapkv(o)?, o)?, Uniform, twin_repair(o)?),
    },
    Entry {
        name: "keydiff",
        paper: "Park et al. 2025, KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in Resource-Constrained Environments (arXiv:2504.15364)",
        summary: "attention-free: keys least similar (cosine) to their head's mean unit key",
        options: Vec::new,
        scored: true,
        build: |_, _| scored(KeyDiff, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "keydiff-block",
        paper: "Park et al. 2025, KeyDiff (arXiv:2504.15364), its block-wise prefill (kvpress's BlockPress around KeyDiffPress)",
        summary: "KeyDiff applied block by block: the kept tokens and each block of 128 rescored together",
        options: || vec![int("block", "128", 1, 65536, "tokens read between two compressions")],
        scored: true,
        build: |o, _| scored(Block::new(Box::new(KeyDiff), o.get_usize("block")?)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "non-causal-attn",
        paper: "Chari & Van Durme 2025, Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate Leverage Scores (arXiv:2507.08143), its attention score (kvpress's NonCausalAttnPress)",
        summary: "query-agnostic: attention each token receives inside its chunk of 256, both directions, times ‖v‖",
        options: || vec![int("chunk", "256", 1, 65536, "tokens per chunk of non-causal attention")],
        scored: true,
        build: |o, _| scored(NonCausalAttn::new(o.get_usize("chunk")?)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "leverage",
        paper: "Chari & Van Durme 2025, Compactor (arXiv:2507.08143), its leverage score (kvpress's LeverageScorePress)",
        summary: "attention-free: approximate leverage of the centred pre-RoPE keys under a Gaussian sketch of 48",
        options: || {
            vec![
                int("sketch", "48", 1, 4096, "columns of the Gaussian sketch"),
                int("seed", "0", 0, 4_294_967_295, "seed of the sketch's draws"),
            ]
        },
        scored: true,
        build: |o, m| {
            let rope = Rope::llama(m.rope_theta, m.head_dim)?;
            scored(
                LeverageScore::new(rope, o.get_usize("sketch")?, o.get_usize("seed")? as u64)?,
                Uniform,
                DecodeSpec::Grow,
            )
        },
    },
    Entry {
        name: "leverage-span",
        paper: "LeverageScorePress (Compactor, arXiv:2507.08143) with whole spans kept: each token scores the best leverage of the 12 before it (kvslice)",
        summary: "key leverage dilated over spans, as snapkv-span does for SnapKV: an outlying key keeps the 12 tokens after it",
        options: || {
            let mut o = vec![
                int("sketch", "48", 1, 4096, "columns of the Gaussian sketch"),
                int("seed", "0", 0, 4_294_967_295, "seed of the sketch's draws"),
            ];
            o.extend(span_options());
            o
        },
        scored: true,
        build: |o, m| {
            let rope = Rope::llama(m.rope_theta, m.head_dim)?;
            let leverage = LeverageScore::new(rope, o.get_usize("sketch")?, o.get_usize("seed")? as u64)?;
            scored(span(leverage, o)?, Uniform, DecodeSpec::Grow)
        },
    },
    Entry {
        name: "compactor",
        paper: "Chari & Van Durme 2025, Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate Leverage Scores (arXiv:2507.08143), kvpress's CompactorPress",
        summary: "query-agnostic: key leverage × the evicted fraction + non-causal chunked attention × ‖v‖, past 8 sinks and before the last 4",
        options: compactor_options,
        scored: true,
        build: |o, m| scored(compactor(o, m)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "compactor-span",
        paper: "Compactor (arXiv:2507.08143) with whole spans kept: each token scores the best blended score of the 12 before it (kvslice)",
        summary: "Compactor's blend dilated over spans, as snapkv-span does for SnapKV",
        options: || {
            let mut o = compactor_options();
            o.extend(span_options());
            o
        },
        scored: true,
        build: |o, m| scored(span(compactor(o, m)?, o)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "simlayerkv",
        paper: "Zhang et al. 2024, SimLayerKV: A Simple Framework for Layer-Level KV Cache Reduction (arXiv:2410.13846), kvpress's SimLayerKVPress",
        summary: "lazy layers (the last query's attention > 0.9 on 4 initial + 1024 recent keys) keep only those; the other layers share what they leave, ranked by SnapKV",
        options: || {
            let mut o = snap_kvpress();
            o.extend([
                float("threshold", "0.9", 0.0, 1.0, "a layer is lazy above this attention mass (1: never)"),
                int("initial", "4", 0, 65536, "initial tokens a lazy layer keeps"),
                int("recent", "1024", 1, 1 << 20, "recent keys of the test; a lazy layer keeps the last recent - 1"),
            ]);
            o
        },
        scored: true,
        build: |o, _| {
            let lazy = Laziness::new(o.get_f64("threshold")?, o.get_usize("initial")?, o.get_usize("recent")?)?;
            scored(SimLayer::new(Box::new(snapkv(o)?), lazy), SimLayerBudget::new(lazy), DecodeSpec::Grow)
        },
    },
    Entry {
        name: "kvzip",
        paper: "Kim et al. 2025, KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction (arXiv:2505.23416), kvpress's KVzipPress",
        summary: "query-agnostic: the attention each key gets while the model repeats the context (one more pass over it), one ranking over every layer and head, 4 sinks",
        options: || {
            vec![
                int("sinks", "4", 0, 65536, "leading tokens always kept"),
                boolean("layerwise", "false", "rank each layer's heads together instead of every layer at once"),
            ]
        },
        scored: true,
        build: |o, _| {
            scored(Kvzip::new(o.get_usize("sinks")?), Global::new(!o.get_bool("layerwise")?), DecodeSpec::Grow)
        },
    },
    Entry {
        name: "finch",
        paper: "Corallo & Papotti 2024, FINCH: Prompt-guided Key-Value Cache Compression for Large Language Models (TACL, doi:10.1162/tacl_a_00716), kvpress's FinchPress",
        summary: "query-aware: SnapKV's window attention with the question as the window, each row weighted by its position; the kept keys renumbered",
        options: || {
            vec![
                int(
                    "window",
                    "32",
                    1,
                    4096,
                    "the question's length: the last `window` queries score the prefix and are kept",
                ),
                boolean("normalize", "true", "weight each window row by its count of visible keys"),
                boolean("rerotate", "true", "rotate the kept keys to consecutive positions"),
            ]
        },
        scored: true,
        build: |o, _| {
            let f = Finch::new(o.get_usize("window")?, o.get_bool("normalize")?, o.get_bool("rerotate")?)?;
            scored(f, Uniform, DecodeSpec::Grow)
        },
    },
    Entry {
        name: "random",
        paper: "uniform random eviction, the baseline of kvpress's RandomPress (seeded SplitMix64 draws)",
        summary: "a seeded uniform sample of the tokens",
        options: || {
            vec![
                int("seed", "0", 0, 4_294_967_295, "seed of the draws (the same seed keeps the same tokens)"),
                int("sinks", "0", 0, 4096, "initial tokens always kept"),
                int("recent", "0", 0, 4096, "newest tokens always kept"),
            ]
        },
        scored: true,
        build: |o, _| {
            let seed = o.get_usize("seed")? as u64;
            scored(Random::new(seed, o.get_usize("sinks")?, o.get_usize("recent")?), Uniform, DecodeSpec::Grow)
        },
    },
    Entry {
        name: "chunkkv",
        paper: "Liu et al. 2025, ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context LLM Inference (arXiv:2502.00299)",
        summary: "whole chunks of 20 tokens ranked by their SnapKV scores (kvpress defaults), the same for every head",
        options: || {
            let mut o = snap_kvpress();
            o.push(int("chunk", "20", 1, 4096, "tokens per chunk; chunks are kept or evicted whole"));
            o
        },
        scored: true,
        build: |o, _| scored(ChunkKv::new(Box::new(snapkv(o)?), o.get_usize("chunk")?)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "lagkv",
        paper: "Liang et al. 2025, LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are Important (arXiv:2504.04704)",
        summary: "attention-free: keys/values min-max normalised by the next partition of 128, ranked per partition",
        options: || {
            vec![
                int("sinks", "4", 0, 4096, "initial tokens always kept (attention sinks)"),
                int("lag", "128", 1, 65536, "partition length: each partition is scored against the next one"),
                boolean(
                    "cross",
                    "false",
                    "keep the raw scores, comparable across partitions, instead of in-partition ranks",
                ),
            ]
        },
        scored: true,
        build: |o, _| {
            scored(
                LagKv::new(o.get_usize("sinks")?, o.get_usize("lag")?, o.get_bool("cross")?)?,
                Uniform,
                DecodeSpec::Grow,
            )
        },
    },
    Entry {
        name: "cur",
        paper: "Sengupta et al. 2025, Value-Guided KV Compression for LLMs via Approximated CUR Decomposition (CurDKV, NeurIPS 2025, arXiv:2509.15038)",
        summary: "attention-free: key × value leverage (squared norms, normalised per window of 16), 4 sinks",
        options: || {
            vec![
                int("sinks", "4", 0, 4096, "initial tokens always kept (attention sinks)"),
                choice(
                    "leverage",
                    "kv_product",
                    &["kv_product", "kv_avg", "key", "value"],
                    "combination of the key and value leverages",
                ),
                boolean("local", "true", "normalise the squared norms over windows of `local_window` positions"),
                int("local_window", "16", 1, 65536, "window of the local normalisation"),
            ]
        },
        scored: true,
        build: |o, _| {
            let leverage = match o.get_str("leverage")? {
                "kv_avg" => Leverage::KvAvg,
                "key" => Leverage::Key,
                "value" => Leverage::Value,
                _ => Leverage::KvProduct,
            };
            let local = o.get_bool("local")?.then_some(o.get_usize("local_window")?);
            scored(Cur::new(o.get_usize("sinks")?, leverage, local)?, Uniform, DecodeSpec::Grow)
        },
    },
    Entry {
        name: "distillcache",
        paper: "learned eviction as in Learning to Evict from Key-Value Cache (KV Policy, arXiv:2602.10238): per-head networks trained offline on traces (kvslice train-policy)",
        summary: "learned: a small network per layer and KV head ranks each entry, from its key and value, by the attention it will receive",
        options: distill_options,
        scored: true,
        build: |o, _| scored(distill(o)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "distillcache-span",
        paper: "DistillCache (learned eviction, arXiv:2602.10238) with whole spans kept: each token scores the best learned score of the 12 before it (kvslice)",
        summary: "the learned score dilated over spans, as snapkv-span does for SnapKV: an entry the networks rank high keeps the 12 tokens after it",
        options: || {
            let mut o = distill_options();
            o.extend(span_options());
            o
        },
        scored: true,
        build: |o, _| scored(span(distill(o)?, o)?, Uniform, DecodeSpec::Grow),
    },
    Entry {
        name: "lacache",
        paper: "Shi et al. 2025, LaCache: Ladder-Shaped KV Caching for Efficient Long-Context Modeling (arXiv:2507.14204)",
        summary: "ladder of positions across layers (span 16, overlap 0, 4 sinks), iterative compaction",
        options: || {
            vec![
                int("span", "16", 1, 4096, "layers that hold each old token"),
                int("overlap", "0", 0, 4095, "overlap of neighbouring layers' rungs (below the span)"),
                int("sinks", "4", 0, 4096, "initial tokens always kept"),
            ]
        },
        scored: false,
        build: |o, _| {
            Ok(Policy::Ladder(Ladder::new(o.get_usize("span")?, o.get_usize("overlap")?, o.get_usize("sinks")?)?))
        },
    },
];

fn compactor_options() -> Vec<OptionSpec> {
    vec![
        int("sketch", "48", 1, 4096, "columns of the Gaussian sketch"),
        int("seed", "0", 0, 4_294_967_295, "seed of the sketch's draws"),
        int("chunk", "256", 1, 65536, "tokens per chunk of non-causal attention"),
        int("sinks", "8", 0, 65536, "leading tokens always kept and left out of both scores"),
        int("recent", "4", 0, 65536, "trailing tokens always kept and left out of both scores"),
        float(
            "blend",
            "-1",
            -1.0,
            1e6,
            "weight of the leverage score; -1: the evicted fraction 1 - budget/n (kvpress)",
        ),
    ]
}

fn compactor(o: &Options, m: &ModelInfo) -> Result<Compactor> {
    let rope = Rope::llama(m.rope_theta, m.head_dim)?;
    let blend = o.get_f64("blend")?;
    let blend = if blend < 0.0 {
        if blend != -1.0 {
            return Err(o.invalid("blend", "a weight ≥ 0, or -1 for the evicted fraction"));
        }
        None
    } else {
        Some(blend)
    };
    Compactor::with(
        rope,
        o.get_usize("sketch")?,
        o.get_usize("seed")? as u64,
        o.get_usize("chunk")?,
        o.get_usize("sinks")?,
        o.get_usize("recent")?,
        blend,
    )
}

fn counter_causal_options(last_layer: &'static str) -> Vec<OptionSpec> {
    vec![
        int("sinks", "4", 0, 4096, "initial tokens always kept"),
        int("window", "32", 0, 4096, "newest tokens always kept"),
        boolean("last_layer", last_layer, "one pass on the last layer, its scores shared by every layer"),
    ]
}

fn counter_causal(o: &Options) -> Result<CounterCausal> {
    Ok(CounterCausal::new(o.get_usize("sinks")?, o.get_usize("window")?, o.get_bool("last_layer")?))
}

fn twinkv_options() -> Vec<OptionSpec> {
    vec![
        int("sinks", "4", 0, 4096, "initial tokens always kept"),
        int("recent", "32", 0, 4096, "newest tokens always kept"),
    ]
}

fn twinkv(o: &Options) -> Result<TwinKv> {
    Ok(TwinKv::new(o.get_usize("sinks")?, o.get_usize("recent")?))
}

/// Every registered policy, in listing order.
pub fn registry() -> &'static [Entry] {
    REGISTRY
}

/// The entry named `name` (a bare name, without options).
pub fn lookup(name: &str) -> Result<&'static Entry> {
    REGISTRY.iter().find(|e| e.name == name).ok_or_else(|| PolicyError::UnknownPolicy {
        name: name.to_string(),
        known: REGISTRY.iter().map(|e| e.name).collect::<Vec<_>>().join(", "),
    })
}

/// Builds the policy written `name` or `name:key=value,…` ([`build_spec`]).
pub fn build(name: &str, model: &ModelInfo) -> Result<Policy> {
    build_spec(name, model)
}

/// Builds the policy written `name:key=value,…` (or a bare `name`, with its defaults).
pub fn build_spec(spec: &str, model: &ModelInfo) -> Result<Policy> {
    let spec: PolicySpec = spec.parse()?;
    let entry = lookup(&spec.name)?;
    entry.build_with(&entry.parse_options(&spec.options)?, model)
}

/// One line per policy: `name — paper`, for `kvslice policies`.
pub fn listing() -> String {
    let width = REGISTRY.iter().map(|e| e.name.len()).max().unwrap_or(0);
    REGISTRY.iter().map(|e| format!("{:width$}  {} — {}\n", e.name, e.summary, e.paper)).collect()
}

/// Every policy with its summary and paper, then one line per option: `name=default`, the
/// accepted values and what it does (`kvslice policies -v`). Entries are separated by a blank
/// line.
pub fn listing_verbose() -> String {
    let mut out = String::new();
    for (i, e) in REGISTRY.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!("{}  {}\n    {}\n", e.name, e.summary, e.paper));
        let options = e.options();
        let w1 = options.iter().map(|o| o.name.len() + 1 + o.default.len()).max().unwrap_or(0);
        let w2 = options.iter().map(|o| o.kind.range().len()).max().unwrap_or(0);
        for o in &options {
            let set = format!("{}={}", o.name, o.default);
            out.push_str(&format!("    {set:w1$}  {:w2$}  {}\n", o.kind.range(), o.help));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: ModelInfo = ModelInfo { head_dim: 8, rope_theta: 10_000.0 };

    /// The prefill parts of a scored policy, or the ladder, as Debug text.
    fn parts(p: &Policy) -> String {
        match p {
            Policy::Scored { scorer, allocator, repair, .. } => format!("{scorer:?} {allocator:?} {repair:?}"),
            Policy::Ladder(l) => format!("{l:?}"),
        }
    }

    fn old(scorer: impl Scorer, allocator: impl Allocator, repair: Option<TwinRepair>) -> String {
        format!("{scorer:?} {allocator:?} {repair:?}")
    }

    /// Each entry's construction before options existed, written out again: building with the
    /// declared defaults gives the same scorer, allocator and repair, parameter for parameter.
    #[test]
    fn defaults_build_what_the_registry_built_before_options() {
        let twin = Some(TwinRepair::default());
        let rope = || Rope::llama(10_000.0, 8).unwrap();
        let cake = CakeIndicator::new(32, 200.0, Pooling::Avg(5)).unwrap();
        let expected: Vec<(&str, String)> = vec![
            ("streaming-llm", old(StreamingLlm::default(), Uniform, None)),
            ("h2o", old(H2o::default(), Uniform, None)),
            ("snapkv", old(SnapKv::default(), Uniform, None)),
            ("snapkv-original", old(SnapKv::original(), Uniform, None)),
            ("tova", old(Tova, Uniform, None)),
            ("knorm", old(Knorm, Uniform, None)),
            ("expected-attention", old(ExpectedAttention::new(rope()), Uniform, None)),
            ("andpro", old(AnDPro::default(), Uniform, None)),
            ("critical-snapkv", old(CriticalKv::new(Box::new(SnapKv::default())), Uniform, None)),
            ("counter-causal", old(CounterCausal::default(), Uniform, None)),
            ("counter-causal-fast", old(CounterCausal::new(4, 32, true), Uniform, None)),
            ("pyramidkv", old(SnapKv::default(), PyramidKv::default(), None)),
            ("cake", old(cake.clone(), Cake::default(), None)),
            ("adakv", old(SnapKv::original(), AdaKv::default(), None)),
            (
                "adakv-kvpress",
                old(SnapKv::default(), AdaKv::new(0.2, AdaMode::Kvpress, Box::new(Uniform)).unwrap(), None),
            ),
            ("snapkv-span", old(Span::new(Box::new(SnapKv::default())), Uniform, None)),
            ("adakv-span", old(Span::new(Box::new(SnapKv::default())), AdaKv::default(), None)),
            ("twinkv", old(TwinKv::default(), Uniform, None)),
            ("snapkv-twin", old(SnapKv::default(), Uniform, twin)),
            ("adakv-twin", old(SnapKv::original(), AdaKv::default(), twin)),
            ("inertiakv", old(Inertia::every_step(), Uniform, None)),
            ("inertiakv-lazy", old(Inertia::lazy(), Uniform, None)),
            ("inertiakv-score-free", old(Inertia::score_free(), Uniform, None)),
            ("jacap", old(Jacap::default(), Uniform, None)),
            ("jacap-span", old(Span::new(Box::new(Jacap::default())), Uniform, None)),
            ("twinkv-span", old(Span::new(Box::new(TwinKv::default())), Uniform, None)),
            ("snapkv-span-twin", old(Span::new(Box::new(SnapKv::default())), Uniform, twin)),
            ("keydiff", old(KeyDiff, Uniform, None)),
            ("keydiff-block", old(Block::new(Box::new(KeyDiff), 128).unwrap(), Uniform, None)),
            ("non-causal-attn", old(NonCausalAttn::default(), Uniform, None)),
            ("leverage", old(LeverageScore::new(rope(), 48, 0).unwrap(), Uniform, None)),
            ("leverage-span", old(Span::new(Box::new(LeverageScore::new(rope(), 48, 0).unwrap())), Uniform, None)),
            ("compactor", old(Compactor::new(rope(), 0).unwrap(), Uniform, None)),
            ("compactor-span", old(Span::new(Box::new(Compactor::new(rope(), 0).unwrap())), Uniform, None)),
            ("simlayerkv", {
                let lazy = Laziness::new(0.9, 4, 1024).unwrap();
                old(SimLayer::new(Box::new(SnapKv::default()), lazy), SimLayerBudget::new(lazy), None)
            }),
            ("kvzip", old(Kvzip::default(), Global::new(true), None)),
            ("finch", old(Finch::new(32, true, true).unwrap(), Uniform, None)),
            ("random", old(Random::default(), Uniform, None)),
            ("chunkkv", old(ChunkKv::new(Box::new(SnapKv::default()), 20).unwrap(), Uniform, None)),
            ("lagkv", old(LagKv::default(), Uniform, None)),
            ("cur", old(Cur::default(), Uniform, None)),
            ("distillcache", old(DistillCache::load("smollm2-135m").unwrap(), Uniform, None)),
            ("distillcache-span", old(Span::new(Box::new(DistillCache::load("smollm2-135m").unwrap())), Uniform, None)),
            ("lacache", format!("{:?}", Ladder::default())),
        ];
        assert_eq!(expected.len(), registry().len());
        for (e, (name, want)) in registry().iter().zip(&expected) {
            assert_eq!(e.name, *name);
            assert_eq!(parts(&e.build(&MODEL).unwrap()), *want, "{name}");
        }
        // the scorer's default is the option's default
        assert_eq!(format!("{:?}", CakeIndicator::default()), format!("{cake:?}"));
    }

    #[test]
    fn a_constructor_refusal_names_the_policy_and_its_options() {
        let e = lookup("snapkv").unwrap();
        let o = e.parse_options(&[("kernel".to_string(), "4".to_string())]).unwrap();
        match e.build_with(&o, &MODEL) {
            Err(PolicyError::InvalidOption { policy, option, reason, options }) => {
                assert_eq!((policy.as_str(), option.as_str()), ("snapkv", "kernel=4"));
                assert_eq!(reason, "snapkv: parameter kernel_size must be odd and positive, got 4");
                assert!(options.starts_with("window=64 (1..=4096), kernel=5 (1..=63)"), "{options}");
            }
            other => panic!("{other:?}"),
        }
        // options parsed for one policy are refused by another
        let h2o = lookup("h2o").unwrap().parse_options(&[]).unwrap();
        assert!(matches!(e.build_with(&h2o, &MODEL), Err(PolicyError::InvalidOption { .. })));
        // a model the policy cannot use stays a parameter error
        let odd = ModelInfo { head_dim: 7, rope_theta: 10_000.0 };
        assert!(matches!(build_spec("expected-attention:future=8", &odd), Err(PolicyError::InvalidParameter { .. })));
    }
}
