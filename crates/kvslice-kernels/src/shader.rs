//! The shader table: every WGSL family once, its entry points, its template values, and the
//! portability check (naga: validate, then translate to SPIR-V, MSL, HLSL and GLSL).
//!
//! Every module starts with `shaders/prelude.wgsl` (shared helpers: `touch_bindings`, generated
//! from the module's own bindings, score tiles and online-softmax steps). Parameter blocks are
//! `Params` structs mirrored by the Rust structs of [`crate::params`]; [`check_all`] compares
//! their layouts.
//!
//! The files in `shaders/` are templates: `{{ name }}` placeholders take the workgroup sizes
//! below (so the Rust dispatch arithmetic and the WGSL agree by construction) and the entry
//! point names. Burn's template launcher runs the entry point called `main`, so rendering a
//! kernel names its entry point `main` and gives the other entry points of the family their
//! own names; every rendered module stays valid WGSL with all its entry points.

use burn::backend::wgpu::{KernelSource, SourceTemplate};
use burn::cubecl::prelude::KernelId;

#[cfg(not(target_family = "wasm"))]
use crate::error::{KernelError, Result};

/// Largest supported `head_dim` (workgroup tiles are sized for it).
pub const MAX_HEAD_DIM: usize = 128;

pub(crate) const STATS_WG_ROWS: u32 = 64;
pub(crate) const STATS_WG_COLS: u32 = 64;
pub(crate) const STATS_WG_HEADS: u32 = 256;
pub(crate) const STATS_Q_TILE: u32 = 8;
pub(crate) const COMPACT_WG: u32 = 256;
pub(crate) const COMPACT_PER_THREAD: u32 = 4;
pub(crate) const APPEND_WG: u32 = 256;
pub(crate) const DECODE_WG: u32 = 64;
pub(crate) const DECODE_PART_LEN: u32 = 256;
/// Query heads of one GQA group a `decode.wgsl` partition workgroup serves at most.
pub(crate) const DECODE_GROUP_MAX: u32 = 4;

/// The variant of `decode.wgsl` for `lanes` components per load (1 or 4) and `group` query heads
/// per workgroup (1 to [`DECODE_GROUP_MAX`]).
pub(crate) const fn decode_variant(lanes: u32, group: u32) -> u32 {
    (group - 1) * 2 + if lanes == 4 { 1 } else { 0 }
}

/// The (lanes, group) of a [`decode_variant`].
const fn decode_shape(variant: u32) -> (u32, u32) {
    (if variant % 2 == 1 { 4 } else { 1 }, variant / 2 + 1)
}

const DECODE_VARIANTS: [u32; 2 * DECODE_GROUP_MAX as usize] = {
    let mut out = [0u32; 2 * DECODE_GROUP_MAX as usize];
    let mut i = 0;
    while i < out.len() {
        out[i] = i as u32;
        i += 1;
    }
    out
};
pub(crate) const LINEAR_WG: u32 = 64;
pub(crate) const PROJECT_WG: u32 = 64;
pub(crate) const STEP_WG: u32 = 64;
pub(crate) const QPROJECT_WG: u32 = 64;

/// Workgroup size of `qproject.wgsl` for `rows` rows per invocation: 64 for one row (GPUs); 16
/// for more (CPU adapters), where a workgroup runs on one CPU thread and 64 invocations of four
/// rows left the smaller projections (192 to 576 outputs) one to three workgroups for all the
/// cores (lavapipe, two cores: 576→576 0.77 → 0.42 ms per call).
pub(crate) const fn qproject_wg(rows: u32) -> u32 {
    if rows == 1 { QPROJECT_WG } else { 16 }
}
pub(crate) const GEMM_WG_X: u32 = 16;
pub(crate) const GEMM_WG_Y: u32 = 16;
pub(crate) const GEMM_BK: u32 = 16;

/// Rows of output a `qproject.wgsl` invocation computes: [`QPROJECT_ROWS`] on GPUs; on CPU
/// adapters (llvmpipe, SwiftShader) more, so that one load of the inputs serves several rows.
pub const QPROJECT_ROWS: [u32; 3] = [1, 4, 8];

/// The variant of `qproject.wgsl` for a format's kind code and rows per invocation.
pub(crate) const fn qproject_variant(kind: u32, rows: u32) -> u32 {
    kind + 16 * rows
}

const QPROJECT_VARIANTS: [u32; 30] = {
    let mut out = [0u32; 30];
    let mut i = 0;
    while i < 30 {
        out[i] = qproject_variant((i % 10) as u32, QPROJECT_ROWS[i / 10]);
        i += 1;
    }
    out
};

/// One WGSL file of `shaders/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `window_stats.wgsl`: entries `rows`, `cols`, `heads`.
    WindowStats,
    /// `compact.wgsl`: entry `compact`.
    Compact,
    /// `append.wgsl`: entry `append`.
    Append,
    /// `decode.wgsl`: entries `part`, `combine`, `weights`.
    Decode,
    /// `linear.wgsl` with scalar columns: entries `one`, `four`.
    Linear,
    /// `linear.wgsl` with `vec4` columns (`d_out % 4 == 0`): entries `one`, `four`.
    Linear4,
    /// `project.wgsl` with scalar columns: entry `project`.
    Project,
    /// `project.wgsl` with `vec4` columns (`d_out % 4 == 0`): entry `project`.
    Project4,
    /// `step.wgsl`: entries `rope`, `norm`.
    Step,
    /// `qproject.wgsl`: entries `project`, `dequant`.
    QProject,
    /// `gemm.wgsl`: entry `gemm`.
    Gemm,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 11] = [
        Family::WindowStats,
        Family::Compact,
        Family::Append,
        Family::Decode,
        Family::Linear,
        Family::Linear4,
        Family::Project,
        Family::Project4,
        Family::Step,
        Family::QProject,
        Family::Gemm,
    ];

    /// File name under `shaders/`.
    pub fn file_name(self) -> &'static str {
        match self {
            Family::WindowStats => "window_stats.wgsl",
            Family::Compact => "compact.wgsl",
            Family::Append => "append.wgsl",
            Family::Decode => "decode.wgsl",
            Family::Linear | Family::Linear4 => "linear.wgsl",
            Family::Project | Family::Project4 => "project.wgsl",
            Family::Step => "step.wgsl",
            Family::QProject => "qproject.wgsl",
            Family::Gemm => "gemm.wgsl",
        }
    }

    /// The template text.
    pub fn template(self) -> &'static str {
        match self {
            Family::WindowStats => include_str!("../../../shaders/window_stats.wgsl"),
            Family::Compact => include_str!("../../../shaders/compact.wgsl"),
            Family::Append => include_str!("../../../shaders/append.wgsl"),
            Family::Decode => include_str!("../../../shaders/decode.wgsl"),
            Family::Linear | Family::Linear4 => include_str!("../../../shaders/linear.wgsl"),
            Family::Project | Family::Project4 => include_str!("../../../shaders/project.wgsl"),
            Family::Step => include_str!("../../../shaders/step.wgsl"),
            Family::QProject => include_str!("../../../shaders/qproject.wgsl"),
            Family::Gemm => include_str!("../../../shaders/gemm.wgsl"),
        }
    }

    /// Entry points of the family.
    pub fn entries(self) -> &'static [&'static str] {
        match self {
            Family::WindowStats => &["rows", "cols", "heads"],
            Family::Compact => &["compact"],
            Family::Append => &["append"],
            Family::Decode => &["part", "combine", "weights"],
            Family::Linear | Family::Linear4 => &["one", "four"],
            Family::Project | Family::Project4 => &["project"],
            Family::Step => &["rope", "norm"],
            Family::QProject => &["project", "dequant"],
            Family::Gemm => &["gemm"],
        }
    }

    /// Specializations of the family, one pipeline each. `qproject.wgsl` is compiled once per
    /// block format and rows per invocation ([`qproject_variant`]), so that every branch on the
    /// format folds away at compile time (on llvmpipe the run-time branches cost 2.9× the whole
    /// projection). `decode.wgsl` is compiled per load width and query heads per workgroup
    /// ([`decode_variant`]). Other families have one (0).
    pub fn variants(self) -> &'static [u32] {
        match self {
            Family::QProject => &QPROJECT_VARIANTS,
            Family::Decode => &DECODE_VARIANTS,
            _ => &[0],
        }
    }

    /// The template values of one of [`Family::variants`].
    fn variant_values(self, variant: u32) -> Vec<(&'static str, u32)> {
        match self {
            Family::QProject => {
                vec![("kind", variant % 16), ("rows", variant / 16), ("wg", qproject_wg(variant / 16))]
            }
            Family::Decode => {
                let (lanes, group) = decode_shape(variant);
                let upt = (MAX_HEAD_DIM as u32 / lanes).div_ceil(DECODE_WG);
                vec![("lanes", lanes), ("group", group), ("upt", upt)]
            }
            _ => vec![],
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Family::WindowStats => "stats",
            Family::Compact => "compact",
            Family::Append => "append",
            Family::Decode => "decode",
            Family::Linear | Family::Linear4 => "linear",
            Family::Project | Family::Project4 => "project",
            Family::Step => "step",
            Family::QProject => "qproject",
            Family::Gemm => "gemm",
        }
    }

    fn values(self) -> Vec<(&'static str, u32)> {
        let d_max = MAX_HEAD_DIM as u32;
        match self {
            Family::WindowStats => vec![
                ("wg_rows", STATS_WG_ROWS),
                ("wg_cols", STATS_WG_COLS),
                ("wg_heads", STATS_WG_HEADS),
                ("q_tile", STATS_Q_TILE),
                ("d_max", d_max),
            ],
            Family::Compact => vec![("wg", COMPACT_WG), ("per_thread", COMPACT_PER_THREAD)],
            Family::Append => vec![("wg", APPEND_WG)],
            Family::Decode => vec![("wg", DECODE_WG), ("d_max", d_max), ("part_len", DECODE_PART_LEN)],
            Family::Linear | Family::Linear4 => vec![("wg", LINEAR_WG)],
            Family::Project | Family::Project4 => vec![("wg", PROJECT_WG)],
            Family::Step => vec![("wg", STEP_WG)],
            Family::QProject => vec![],
            Family::Gemm => vec![("wg_x", GEMM_WG_X), ("wg_y", GEMM_WG_Y), ("bk", GEMM_BK)],
        }
    }

    /// Type and expression placeholders (`{{ vtype }}` of `linear.wgsl`; `decode.wgsl`'s V, its
    /// dot product and lane access).
    fn types(self, variant: u32) -> &'static [(&'static str, &'static str)] {
        match self {
            Family::Linear | Family::Project => &[("vtype", "f32")],
            Family::Linear4 | Family::Project4 => &[("vtype", "vec4<f32>")],
            Family::Decode if decode_shape(variant).0 == 4 => {
                &[("vtype", "vec4<f32>"), ("vdot", "dot(a, b)"), ("lane", "y[i]")]
            }
            Family::Decode => &[("vtype", "f32"), ("vdot", "a * b"), ("lane", "y")],
            _ => &[],
        }
    }

    /// Length of the prelude's score tiles: the workgroup size of the family's online-softmax
    /// entry point (`rows` of the window statistics, `part` of decode).
    fn tile(self) -> u32 {
        match self {
            Family::WindowStats => STATS_WG_ROWS,
            Family::Decode => DECODE_WG,
            other => other.workgroup(other.entries()[0]),
        }
    }

    /// Workgroup size of an entry point in one of the family's [`Family::variants`].
    pub fn workgroup_variant(self, entry: &str, variant: u32) -> u32 {
        match self {
            Family::QProject => qproject_wg(variant / 16),
            _ => self.workgroup(entry),
        }
    }

    /// Workgroup size of an entry point (what the dispatch arithmetic divides by), in the
    /// family's first variant.
    pub fn workgroup(self, entry: &str) -> u32 {
        match (self, entry) {
            (Family::WindowStats, "rows") => STATS_WG_ROWS,
            (Family::WindowStats, "cols") => STATS_WG_COLS,
            (Family::WindowStats, _) => STATS_WG_HEADS,
            (Family::Compact, _) => COMPACT_WG,
            (Family::Append, _) => APPEND_WG,
            (Family::Decode, _) => DECODE_WG,
            (Family::Linear | Family::Linear4, _) => LINEAR_WG,
            (Family::Project | Family::Project4, _) => PROJECT_WG,
            (Family::Step, _) => STEP_WG,
            (Family::QProject, _) => QPROJECT_WG,
            (Family::Gemm, _) => GEMM_WG_X * GEMM_WG_Y,
        }
    }
}

/// The prelude every module starts with (`shaders/prelude.wgsl`).
pub const PRELUDE: &str = include_str!("../../../shaders/prelude.wgsl");

/// The body of `touch_bindings` for `family`: `arrayLength` of every array binding (of the
/// runtime-sized tail for a `Params` block that has one), read off the template's declarations.
fn touch_expression(family: Family) -> String {
    let tail = crate::params::layout(family).and_then(|l| l.tail);
    let mut terms = vec!["0u".to_string()];
    for line in family.template().lines() {
        let Some(decl) = line.trim().strip_prefix("@group(0) @binding(") else { continue };
        let Some((_, var)) = decl.split_once("var<storage, read_write>") else { continue };
        let Some((name, ty)) = var.trim().trim_end_matches(';').split_once(':') else { continue };
        let (name, ty) = (name.trim(), ty.trim());
        if ty.starts_with("array<") {
            terms.push(format!("arrayLength(&{name})"));
        } else if let (true, Some(tail)) = (ty == "Params", tail) {
            terms.push(format!("arrayLength(&{name}.{tail})"));
        }
    }
    terms.join(" + ")
}

/// The template of `family` with entry point `entry` named `main` and every value registered,
/// after the shared prelude (the family's first variant).
pub fn template(family: Family, entry: &str) -> SourceTemplate {
    template_variant(family, entry, family.variants()[0])
}

/// [`template`] for one of the family's [`Family::variants`].
pub fn template_variant(family: Family, entry: &str, variant: u32) -> SourceTemplate {
    let mut t = SourceTemplate::new(format!("{PRELUDE}{}", family.template()));
    for (name, value) in family.variant_values(variant) {
        t = t.register(name, value.to_string());
    }
    t = t.register("touch", touch_expression(family));
    t = t.register("tile", family.tile().to_string());
    for (name, value) in family.values() {
        t = t.register(name, value.to_string());
    }
    for &(name, ty) in family.types(variant) {
        t = t.register(name, ty);
    }
    for &e in family.entries() {
        let name = if e == entry { "main".to_string() } else { format!("{}_{e}", family.prefix()) };
        t = t.register(format!("entry_{e}"), name);
    }
    t
}

/// The WGSL module that runs for `family`/`entry`, as the device receives it (the family's
/// first variant).
pub fn render(family: Family, entry: &str) -> String {
    template(family, entry).complete()
}

/// [`render`] for one of the family's [`Family::variants`].
pub fn render_variant(family: Family, entry: &str, variant: u32) -> String {
    template_variant(family, entry, variant).complete()
}

/// A rendered entry point, launched through Burn's template kernel API.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WgslKernel {
    pub family: Family,
    pub entry: &'static str,
    pub variant: u32,
}

impl KernelSource for WgslKernel {
    fn source(&self) -> SourceTemplate {
        template_variant(self.family, self.entry, self.variant)
    }

    fn id(&self) -> KernelId {
        KernelId::new::<Self>().info((self.family, self.entry, self.variant))
    }

    fn lang(&self) -> &'static str {
        "wgsl"
    }
}

/// Sizes of one module's translations (SPIR-V words, characters of MSL, HLSL and GLSL).
#[cfg(not(target_family = "wasm"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Translations {
    /// SPIR-V words.
    pub spirv_words: usize,
    /// Metal Shading Language characters.
    pub msl_chars: usize,
    /// HLSL (shader model 5.1) characters.
    pub hlsl_chars: usize,
    /// GLSL ES 3.10 compute characters.
    pub glsl_chars: usize,
}

/// The portability check of one entry point.
#[cfg(not(target_family = "wasm"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Portability {
    /// Family of the entry point.
    pub family: Family,
    /// Entry point.
    pub entry: &'static str,
    /// The specialization ([`Family::variants`]).
    pub variant: u32,
    /// What it translated to.
    pub translations: Translations,
}

/// Parses and validates every entry point of every family with naga and translates it to
/// SPIR-V, MSL, HLSL and GLSL: the portability check for GPUs that are not at hand.
#[cfg(not(target_family = "wasm"))]
pub fn check_all() -> Result<Vec<Portability>> {
    let mut out = Vec::new();
    for family in Family::ALL {
        for &entry in family.entries() {
            for &variant in family.variants() {
                let name = format!("{}/{entry}/{variant}", family.file_name());
                let source = render_variant(family, entry, variant);
                check_params(&name, &source, crate::params::layout(family))?;
                let translations = check_source(&name, &source)?;
                out.push(Portability { family, entry, variant, translations });
            }
        }
    }
    Ok(out)
}

/// Checks that the module's `Params` struct has exactly the members, offsets and size of the
/// Rust parameter block `layout` (a runtime-sized last member sits at the block's size), or,
/// when there is no Rust block, that the module declares no `Params`.
#[cfg(not(target_family = "wasm"))]
pub fn check_params(kernel: &str, source: &str, layout: Option<crate::params::Layout>) -> Result<()> {
    let fail = |message: String| KernelError::Shader { kernel: kernel.to_string(), stage: "params", message };
    let module = naga::front::wgsl::parse_str(source).map_err(|e| fail(e.emit_to_string(source)))?;
    let params = module.types.iter().find(|(_, t)| t.name.as_deref() == Some("Params"));
    let (layout, (_, ty)) = match (layout, params) {
        (None, None) => return Ok(()),
        (Some(_), None) => return Err(fail("no `Params` struct in the shader".into())),
        (None, Some(_)) => return Err(fail("a `Params` struct without a Rust parameter block".into())),
        (Some(l), Some(p)) => (l, p),
    };
    let naga::TypeInner::Struct { members, span } = &ty.inner else {
        return Err(fail("`Params` is not a struct".into()));
    };
    let mut wgsl: Vec<(String, usize)> =
        members.iter().map(|m| (m.name.clone().unwrap_or_default(), m.offset as usize)).collect();
    let tail = match layout.tail {
        Some(name) => {
            let last = members.last().map(|m| &module.types[m.ty].inner);
            let dynamic = matches!(last, Some(naga::TypeInner::Array { size: naga::ArraySize::Dynamic, .. }));
            let (got, offset) = wgsl.pop().unwrap_or_default();
            if !dynamic || got != name || offset != layout.size {
                return Err(fail(format!(
                    "tail `{name}` expected as a runtime-sized array at byte {}, got `{got}` at byte {offset}",
                    layout.size
                )));
            }
            true
        }
        None => false,
    };
    let rust: Vec<(String, usize)> = layout.members.iter().map(|&(n, o)| (n.to_string(), o)).collect();
    if wgsl != rust {
        return Err(fail(format!("members (name, offset): WGSL {wgsl:?}, Rust {rust:?}")));
    }
    if !tail && *span as usize != layout.size {
        return Err(fail(format!("size: WGSL {span} bytes, Rust {} bytes", layout.size)));
    }
    Ok(())
}

/// Validates a WGSL module whose compute entry point is `main` and translates it to SPIR-V,
/// MSL, HLSL and GLSL ES 3.10; `kernel` names it in errors.
#[cfg(not(target_family = "wasm"))]
pub fn check_source(kernel: &str, source: &str) -> Result<Translations> {
    use naga::back::{glsl, hlsl, msl, spv};
    use naga::valid::{Capabilities, ValidationFlags, Validator};

    let fail =
        |stage: &'static str, message: String| KernelError::Shader { kernel: kernel.to_string(), stage, message };
    if source.contains("{{") {
        return Err(fail("template", "unfilled placeholder".into()));
    }
    let module = naga::front::wgsl::parse_str(source).map_err(|e| fail("parse", e.emit_to_string(source)))?;
    let info = Validator::new(ValidationFlags::all(), Capabilities::empty())
        .validate(&module)
        .map_err(|e| fail("validate", e.emit_to_string(source)))?;

    let spirv =
        spv::write_vec(&module, &info, &spv::Options::default(), None).map_err(|e| fail("spirv", e.to_string()))?;

    let (msl_src, _) = msl::write_string(&module, &info, &msl::Options::default(), &msl::PipelineOptions::default())
        .map_err(|e| fail("msl", e.to_string()))?;

    let mut hlsl_src = String::new();
    let hlsl_options = hlsl::Options::default();
    hlsl::Writer::new(&mut hlsl_src, &hlsl_options, &hlsl::PipelineOptions::default())
        .write(&module, &info, None)
        .map_err(|e| fail("hlsl", e.to_string()))?;

    let mut glsl_src = String::new();
    let glsl_options = glsl::Options {
        version: glsl::Version::Embedded { version: 310, is_webgl: false },
        ..glsl::Options::default()
    };
    let pipeline =
        glsl::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point: "main".into(), multiview: None };
    glsl::Writer::new(
        &mut glsl_src,
        &module,
        &info,
        &glsl_options,
        &pipeline,
        naga::proc::BoundsCheckPolicies::default(),
    )
    .map_err(|e| fail("glsl", e.to_string()))?
    .write()
    .map_err(|e| fail("glsl", e.to_string()))?;

    Ok(Translations {
        spirv_words: spirv.len(),
        msl_chars: msl_src.len(),
        hlsl_chars: hlsl_src.len(),
        glsl_chars: glsl_src.len(),
    })
}
