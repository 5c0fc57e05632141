"""Writes tests/golden/VERSIONS.md: the package versions and date of the last regeneration."""

import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import GOLDEN_DIR, versions  # noqa: E402


def main() -> None:
    v = versions()
    lines = [
        "# Golden data versions",
        "",
        "Produced by HF transformers on CPU, float32, eager attention, one thread, offline.",
        "",
        "| package | version |",
        "| --- | --- |",
        *[f"| {k} | {val} |" for k, val in v.items()],
        "",
        f"Generated: {datetime.date.today().isoformat()}",
        "",
        "Regenerate everything (see scripts/golden/README.md for the environment):",
        "",
        "```",
        "GOLDEN_PYTHON=/path/to/venv/bin/python scripts/golden/make_all.sh",
        "```",
        "",
        "Pinned environment: scripts/golden/requirements.txt (direct) and",
        "scripts/golden/requirements-lock.txt (full freeze).",
        "",
    ]
    path = os.path.join(GOLDEN_DIR, "VERSIONS.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
