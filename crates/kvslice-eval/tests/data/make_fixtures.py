"""Small SQLite databases and their contents as read by Python's sqlite3, the reference for
kvslice-eval's pure-Rust reader (src/sqlite.rs) and the KJV text conversion (src/corpus.rs).

    cd crates/kvslice-eval/tests/data && python3 make_fixtures.py

Produced with Python 3.11.7 and SQLite 3.40.1 (Debian 12). The databases are committed; a
different SQLite may lay pages out differently but must give the same rows.
"""

import json
import os
import random
import sqlite3
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def fresh(name, page_size):
    path = os.path.join(HERE, name)
    if os.path.exists(path):
        os.remove(path)
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA page_size = {page_size}")
    return path, con


def mixed():
    """Many rows on 512-byte pages: interior pages, overflow chains, every serial type."""
    path, con = fresh("mixed.db", 512)
    con.execute("CREATE TABLE other(x TEXT)")
    con.execute("INSERT INTO other VALUES ('not this one')")
    con.execute("CREATE TABLE t(a INT, b TEXT, c REAL, d BLOB, e INT)")
    rng = random.Random(5)
    ints = [0, 1, -1, 127, -128, 300, -40000, 8388607, -8388608, 2**31 - 1, -(2**31), 2**40 + 7, -(2**47), 2**63 - 1, -(2**63)]
    rows = []
    for i in range(200):
        a = ints[i % len(ints)]
        n = rng.choice([0, 1, 5, 40, 200, 480, 1500])
        b = "".join(rng.choice("abcdefghij é∑") for _ in range(n))
        c = None if i % 7 == 0 else (i * 0.5 - 17.25)
        d = None if i % 3 else bytes(rng.randrange(256) for _ in range(rng.choice([0, 3, 600])))
        e = None if i % 5 == 0 else i
        rows.append((a, b, c, d, e))
    con.executemany("INSERT INTO t VALUES (?,?,?,?,?)", rows)
    con.execute("DELETE FROM t WHERE rowid % 37 = 0")
    con.commit()
    out = []
    for r in con.execute("SELECT rowid, a, b, c, d, e FROM t ORDER BY rowid"):
        out.append([r[0], r[1], r[2], r[3], None if r[4] is None else r[4].hex(), r[5]])
    con.close()
    with open(os.path.join(HERE, "mixed.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False)


def bible():
    """The KJV wheel's table layout with pre-joined verses and split paragraphs."""
    path, con = fresh("bible.db", 1024)
    con.execute("CREATE TABLE Books(\n  TestamentID INT,\n  BookID INT,\n  ShortName TEXT,\n  LongName TEXT\n)")
    con.execute(
        "CREATE TABLE Bible(\n  TestamentID INT,\n  BookID INT,\n  ChapterID INT,\n  VerseID INT,\n  Index_ TEXT,\n"
        "  IndexTypeID INT,\n  NumParagraphs INT,\n  Passage1 TEXT,\n  Passage2 TEXT\n)"
    )
    rows = [
        (1, 1, 1, 1, "1:1", 0, 1, "1:1 In the beginning was a test.", ""),
        (1, 1, 1, 2, "1:2-3", 1, 1, "1:2 Two words, then  more. 1:3 Three: here.", ""),
        (1, 1, 1, 4, "1:4", 0, 2, "1:4 First part.", "Second part; 1:5 And the fifth."),
        (1, 1, 1, 6, "1:6-2:1", 2, 1, "1:6 End of chapter?  2:1 Start of the next!", ""),
        (2, 40, 1, 1, "1:1", 0, 1, "1:1 " + "Long verse " * 200 + "end.", ""),
    ]
    con.executemany("INSERT INTO Bible VALUES (?,?,?,?,?,?,?,?,?)", rows)
    con.commit()
    con.close()
    text = subprocess.run(
        [sys.executable, os.path.join(HERE, "..", "..", "..", "..", "tests", "eval", "kjv_text.py"), path],
        check=True,
        capture_output=True,
    ).stdout
    with open(os.path.join(HERE, "bible.txt"), "wb") as f:
        f.write(text)


if __name__ == "__main__":
    mixed()
    bible()
    print(sys.version.split()[0], sqlite3.sqlite_version)
