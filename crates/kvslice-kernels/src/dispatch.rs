//! Counting what reaches the device: every kernel launch the process issues while a
//! [`count`] runs, by kernel and by the part of the model that issued it.
//!
//! The count comes from the launch path itself (the runtime's launch observer, called on the
//! issuing thread before each launch is submitted), so it is the number of compute dispatches
//! submitted, Burn's kernels and kvslice's WGSL ones alike, not an estimate. Work is issued on
//! the thread that runs it (no operation fusion queues launches for later), so a thread's count
//! is its work's. Buffer copies and
//! uploads are not dispatches and are not counted. The CPU backend launches nothing.
//!
//! The model marks its parts with [`scope`] (`embed`, `layer`, `head`); a launch outside every
//! scope counts under `other`. kvslice's own kernels are named `wgsl:<shader>/<entry>`; Burn's
//! by their type path without generic parameters.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use burn::cubecl::logging::{LaunchObservation, LaunchObserver};

use crate::shader::Family;

thread_local! {
    /// The kvslice shader being launched on this thread, set around its launch (every WGSL
    /// template reaches the runtime under one type name).
    static LABEL: Cell<Option<(Family, &'static str)>> = const { Cell::new(None) };
    /// The part of the model issuing launches on this thread.
    static SCOPE: Cell<&'static str> = const { Cell::new(OTHER) };
}

/// The scope of launches issued outside every [`scope`].
pub const OTHER: &str = "other";

/// Launches counted by [`count`]: `(scope, kernel) → launches`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dispatches {
    pub by_kernel: BTreeMap<(String, String), u64>,
}

impl Dispatches {
    /// Every launch counted.
    pub fn total(&self) -> u64 {
        self.by_kernel.values().sum()
    }

    /// The launches issued in `scope`.
    pub fn in_scope(&self, scope: &str) -> u64 {
        self.by_kernel.iter().filter(|((s, _), _)| s == scope).map(|(_, n)| n).sum()
    }

    /// Adds another count to this one.
    pub fn add(&mut self, other: &Dispatches) {
        for (key, n) in &other.by_kernel {
            *self.by_kernel.entry(key.clone()).or_default() += n;
        }
    }
}

type Counts = BTreeMap<(&'static str, Name), u64>;

thread_local! {
    /// The counts of the [`count`] running on this thread, if one is.
    static COUNTS: RefCell<Option<Counts>> = const { RefCell::new(None) };
}

/// The one observer, installed by the first [`count`] and kept for the life of the process:
/// it adds each launch to the counts of the thread that issued it, so that counts on
/// several threads at once (tests run in parallel) stay apart.
struct Counter;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Name {
    Burn(&'static str),
    Wgsl(&'static str, &'static str),
}

impl LaunchObserver for Counter {
    fn launched(&self, kernel: &'static str) {
        COUNTS.with(|c| {
            if let Some(counts) = c.borrow_mut().as_mut() {
                let name = match LABEL.with(Cell::get) {
                    Some((family, entry)) => Name::Wgsl(family.file_name(), entry),
                    None => Name::Burn(kernel),
                };
                *counts.entry((SCOPE.with(Cell::get), name)).or_default() += 1;
            }
        });
    }
}

fn install() {
    static INSTALLED: OnceLock<LaunchObservation> = OnceLock::new();
    INSTALLED.get_or_init(|| LaunchObservation::new(Arc::new(Counter)));
}

/// `burn_cubecl::kernel::matmul::Foo<f32, u32>` → `matmul::Foo`: the path's last two segments,
/// generic parameters dropped.
fn short(type_name: &str) -> String {
    let base = type_name.split('<').next().unwrap_or(type_name);
    let parts: Vec<&str> = base.split("::").filter(|p| !p.is_empty()).collect();
    parts[parts.len().saturating_sub(2)..].join("::")
}

/// Runs `f` and counts the kernel launches this thread issues while it runs (launches from
/// other threads are theirs). A `count` inside another adds its launches to both.
pub fn count<R>(f: impl FnOnce() -> R) -> (R, Dispatches) {
    install();
    let outer = COUNTS.with(|c| c.borrow_mut().replace(Counts::new()));
    let out = f();
    let counts = COUNTS.with(|c| c.borrow_mut().take()).unwrap_or_default();
    if let Some(mut outer) = outer {
        for (key, n) in &counts {
            *outer.entry(*key).or_default() += n;
        }
        COUNTS.with(|c| *c.borrow_mut() = Some(outer));
    }
    let mut by_kernel = BTreeMap::new();
    for (&(scope, name), &n) in counts.iter() {
        let kernel = match name {
            Name::Burn(k) => short(k),
            Name::Wgsl(file, entry) => format!("wgsl:{}/{entry}", file.trim_end_matches(".wgsl")),
        };
        *by_kernel.entry((scope.to_string(), kernel)).or_default() += n;
    }
    (out, Dispatches { by_kernel })
}

/// Marks the launches issued on this thread until the guard drops as `name`'s.
#[must_use = "the scope ends when the guard drops"]
pub struct Scope {
    previous: &'static str,
}

/// Enters scope `name` (see the module docs); the previous one comes back on drop.
pub fn scope(name: &'static str) -> Scope {
    Scope { previous: SCOPE.with(|s| s.replace(name)) }
}

impl Drop for Scope {
    fn drop(&mut self) {
        SCOPE.with(|s| s.set(self.previous));
    }
}

/// Runs `launch` (one kvslice shader launch) with its name set for the counter.
pub(crate) fn labelled(family: Family, entry: &'static str, launch: impl FnOnce()) {
    let previous = LABEL.with(|l| l.replace(Some((family, entry))));
    launch();
    LABEL.with(|l| l.set(previous));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_paths_shorten_to_their_last_two_segments() {
        assert_eq!(short("burn_cubecl::kernel::matmul::Foo<f32, a::B>"), "matmul::Foo");
        assert_eq!(short("Foo"), "Foo");
    }

    #[test]
    fn scopes_nest_and_restore() {
        assert_eq!(SCOPE.with(Cell::get), OTHER);
        {
            let _a = scope("layer");
            {
                let _b = scope("head");
                assert_eq!(SCOPE.with(Cell::get), "head");
            }
            assert_eq!(SCOPE.with(Cell::get), "layer");
        }
        assert_eq!(SCOPE.with(Cell::get), OTHER);
    }
}
