//! Sweeps beyond one machine: `kvslice eval --shard K/N` runs the K-th of N disjoint slices of
//! the cases (K from 0, as a Kubernetes Indexed Job's `JOB_COMPLETION_INDEX` and a Slurm array's
//! `SLURM_ARRAY_TASK_ID` count), and `kvslice report merge` joins the shards' reports into the
//! one a single run writes ([`crate::Report::merge_disjoint`]).
//!
//! Case `i` belongs to shard `i mod N`: suites are written shortest first, so dealing them out
//! in turn gives every shard a similar share of long prompts.

use crate::error::{EvalError, Result};

/// The environment variables that name a shard's index, in the order they are read.
pub const INDEX_VARIABLES: [&str; 2] = ["JOB_COMPLETION_INDEX", "SLURM_ARRAY_TASK_ID"];

/// One of `count` disjoint slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

fn bad(spec: &str, reason: impl std::fmt::Display) -> EvalError {
    EvalError::Report { reason: format!("--shard {spec}: {reason}") }
}

impl Shard {
    /// `K/N`, or `N` alone with K read from the first of [`INDEX_VARIABLES`] that `env` has.
    pub fn parse(spec: &str, env: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let number = |s: &str, what: &str| {
            s.trim().parse::<usize>().map_err(|_| bad(spec, format!("{what} `{s}` is not a whole number")))
        };
        let (index, count) = match spec.split_once('/') {
            Some((k, n)) => (number(k, "the index")?, number(n, "the shard count")?),
            None => {
                let count = number(spec, "the shard count")?;
                let (var, value) = INDEX_VARIABLES.iter().find_map(|v| env(v).map(|x| (*v, x))).ok_or_else(|| {
                    bad(spec, format!("no index given and none of {} is set", INDEX_VARIABLES.join(", ")))
                })?;
                (number(&value, var)?, count)
            }
        };
        if count == 0 {
            return Err(bad(spec, "the shard count must be at least 1"));
        }
        if index >= count {
            return Err(bad(spec, format!("index {index} is not below the shard count {count} (indices start at 0)")));
        }
        Ok(Shard { index, count })
    }

    /// Whether item `i` (0-based, in file order) is this shard's.
    pub fn owns(&self, i: usize) -> bool {
        i % self.count == self.index
    }

    /// This shard's items, in their order.
    pub fn select<T>(&self, items: Vec<T>) -> Vec<T> {
        items.into_iter().enumerate().filter(|(i, _)| self.owns(*i)).map(|(_, x)| x).collect()
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn an_index_comes_from_the_spec_or_the_job_environment() {
        assert_eq!(Shard::parse("2/5", no_env).unwrap(), Shard { index: 2, count: 5 });
        let k8s = |v: &str| (v == "JOB_COMPLETION_INDEX").then(|| "3".to_string());
        assert_eq!(Shard::parse("4", k8s).unwrap(), Shard { index: 3, count: 4 });
        let slurm = |v: &str| (v == "SLURM_ARRAY_TASK_ID").then(|| "0".to_string());
        assert_eq!(Shard::parse("2", slurm).unwrap(), Shard { index: 0, count: 2 });
        // Kubernetes first when both are set
        let both = |v: &str| Some(if v == "JOB_COMPLETION_INDEX" { "1" } else { "0" }.to_string());
        assert_eq!(Shard::parse("2", both).unwrap().index, 1);
        // an explicit index wins over the environment
        assert_eq!(Shard::parse("0/2", both).unwrap().index, 0);
    }

    #[test]
    fn nonsense_is_refused_with_the_reason() {
        for (spec, needle) in [
            ("3/3", "not below"),
            ("0/0", "at least 1"),
            ("a/2", "not a whole number"),
            ("-1/2", "not a whole number"),
            ("4", "JOB_COMPLETION_INDEX"),
        ] {
            let e = Shard::parse(spec, no_env).unwrap_err().to_string();
            assert!(e.contains(needle), "{spec}: {e}");
        }
        let e = Shard::parse("2", |_| Some("x".into())).unwrap_err().to_string();
        assert!(e.contains("JOB_COMPLETION_INDEX `x`"), "{e}");
    }

    #[test]
    fn the_shards_are_disjoint_and_cover_every_case_once() {
        let items: Vec<usize> = (0..23).collect();
        let mut seen = Vec::new();
        for index in 0..4 {
            let part = Shard { index, count: 4 }.select(items.clone());
            assert!(part.windows(2).all(|w| w[0] < w[1]), "file order kept");
            assert!((5..=6).contains(&part.len()));
            seen.extend(part);
        }
        seen.sort();
        assert_eq!(seen, items);
        assert_eq!(Shard { index: 0, count: 1 }.select(items.clone()), items);
    }
}
