#!/usr/bin/env python3
"""Writes shared-cells.db: a valid-looking 16-page SQLite file (512-byte pages) whose table
"t" has an interior root with 12 cell pointers to one cell (child: page 3), and page 3 holds
196 cell pointers to one cell whose 6585-byte payload (a record header of Null types)
overflows through pages 4..16. Each byte is stored once, but the walk would decode
12 * 196 rows of 6584 values each (about 1 GB of values from 8 KiB) without the reader's
payload bound. Found while fuzzing the reader (crates/kvslice-fuzz, target sqlite).

    python3 make_shared_cells.py > shared-cells.db
"""

import struct
import sys

PS, NP, SIZE = 512, 16, 6585


def varint(v):
    out = [v & 0x7F]
    v >>= 7
    while v:
        out.append(0x80 | (v & 0x7F))
        v >>= 7
    return bytes(reversed(out))


def record(vals):
    hdr, body = b"", b""
    for v in vals:
        if isinstance(v, int):
            hdr += varint(1)
            body += struct.pack(">b", v)
        else:
            b = v.encode()
            hdr += varint(13 + 2 * len(b))
            body += b
    return varint(len(hdr) + 1) + hdr + body


pages = [bytearray(PS) for _ in range(NP)]
# Page 1: file header and the schema, one row ("table", "t", "t", 2, "CREATE TABLE t(a)").
p = pages[0]
p[:16] = b"SQLite format 3\0"
p[16:18] = struct.pack(">H", PS)
p[18:24] = bytes([1, 1, 0, 64, 32, 32])
p[28:32] = struct.pack(">I", NP)
p[56:60] = struct.pack(">I", 1)
rec = record(["table", "t", "t", 2, "CREATE TABLE t(a)"])
cell = varint(len(rec)) + varint(1) + rec
off = PS - len(cell)
p[off:] = cell
p[100] = 0x0D
p[103:105] = struct.pack(">H", 1)
p[105:107] = struct.pack(">H", off)
p[108:110] = struct.pack(">H", off)
# Page 2: interior root, NP - 4 pointers to one cell whose child is page 3; right child page 3.
p = pages[1]
cell = struct.pack(">I", 3) + varint(1)
pos = PS - len(cell)
p[pos:] = cell
p[0] = 0x05
p[3:5] = struct.pack(">H", NP - 4)
p[5:7] = struct.pack(">H", pos)
p[8:12] = struct.pack(">I", 3)
for i in range(NP - 4):
    p[12 + 2 * i : 14 + 2 * i] = struct.pack(">H", pos)
# Page 3: leaf, every pointer at one cell; its payload keeps 39 bytes local, the rest overflows.
local = ((PS - 12) * 32 // 255) - 23
payload = varint(SIZE) + bytes(SIZE - len(varint(SIZE)))
cell = varint(SIZE) + varint(1) + payload[:local] + struct.pack(">I", 4)
p = pages[2]
off = 400
n = (off - 8) // 2
p[0] = 0x0D
p[3:5] = struct.pack(">H", n)
p[5:7] = struct.pack(">H", off)
p[off : off + len(cell)] = cell
for i in range(n):
    p[8 + 2 * i : 10 + 2 * i] = struct.pack(">H", off)
# Pages 4..: the overflow chain.
rest, pg = payload[local:], 4
while rest:
    chunk, rest = rest[: PS - 4], rest[PS - 4 :]
    pages[pg - 1][:4] = struct.pack(">I", pg + 1 if rest else 0)
    pages[pg - 1][4 : 4 + len(chunk)] = chunk
    pg += 1
sys.stdout.buffer.write(b"".join(pages))
