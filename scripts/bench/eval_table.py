#!/usr/bin/env python3
"""One markdown table from `kvslice eval --json` and `scripts/peers/kvpress_eval.py --json` reports.

Usage: eval_table.py kvslice.json [kvpress.json]
Rows: the full cache, then every run key's policy (kvpress rows prefixed `kvpress `); columns:
the budgets in the reports, largest first; cells: passed/total. Standard library only.
"""
import json
import sys


def load(path, prefix):
    runs = json.load(open(path))["runs"]
    rows = {}
    for key, run in runs.items():
        policy, _, budget = key.partition("@")
        cell = f'{run["passed"]}/{run["total"]}'
        rows.setdefault(prefix + policy, {})[budget or "full"] = cell
    return rows


def budget_order(b):
    return -float(b.rstrip("%L")) if b.rstrip("%L").replace(".", "").isdigit() else 0.0


def main():
    rows = {}
    for i, path in enumerate(sys.argv[1:]):
        part = load(path, "" if i == 0 else "kvpress ")
        if i > 0:
            part.pop("kvpress full", None)
            full = json.load(open(path))["runs"].get("full")
            if full:
                rows["kvpress full"] = {"full": f'{full["passed"]}/{full["total"]}'}
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
