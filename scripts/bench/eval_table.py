#!/usr/bin/env python3
"""One markdown table from `kvslice eval --json` and `scripts/peers/kvpress_eval.py --json` reports.

Usage: eval_table.py [--common] kvslice.json [kvpress.json]
Rows: the full cache, then every run key's policy (kvpress rows prefixed `kvpress `); columns:
the budgets in the reports, largest first; cells: passed/total. With --common, only the cases
that every run of every report has are counted (e.g. a comparison run that covered fewer cases).
Standard library only.
"""
import json
import sys


COMMON = None


def count(run):
    cases = run["cases"]
    if COMMON is not None:
        cases = {k: v for k, v in cases.items() if k in COMMON}
    return sum(1 for c in cases.values() if c["pass"]), len(cases)


def load(path, prefix):
    runs = json.load(open(path))["runs"]
    rows = {}
    for key, run in runs.items():
        policy, _, budget = key.partition("@")
        passed, total = count(run)
        rows.setdefault(prefix + policy, {})[budget or "full"] = f"{passed}/{total}"
    return rows


def budget_order(b):
    return -float(b.rstrip("%L")) if b.rstrip("%L").replace(".", "").isdigit() else 0.0


def main():
    global COMMON
    paths = [a for a in sys.argv[1:] if a != "--common"]
    if "--common" in sys.argv[1:]:
        sets = [set(r["cases"]) for p in paths for r in json.load(open(p))["runs"].values()]
        COMMON = set.intersection(*sets) if sets else set()
    rows = {}
    for i, path in enumerate(paths):
        part = load(path, "" if i == 0 else "kvpress ")
        if i > 0:
            part.pop("kvpress full", None)
            full = json.load(open(path))["runs"].get("full")
            if full:
                passed, total = count(full)
                rows["kvpress full"] = {"full": f"{passed}/{total}"}
        rows.update(part)
    budgets = sorted({b for r in rows.values() for b in r if b != "full"}, key=budget_order)
    print("| policy | " + " | ".join(budgets) + " |")
    print("|---|" + "---|" * len(budgets))
    for name in sorted(rows, key=lambda n: (0 if n.endswith("full") else 1, n.startswith("kvpress"), n)):
        r = rows[name]
        if "full" in r:
            print(f"| {name} | " + " | ".join(r["full"] for _ in budgets) + " |")
        else:
            print(f"| {name} | " + " | ".join(r.get(b, "–") for b in budgets) + " |")


if __name__ == "__main__":
    main()
