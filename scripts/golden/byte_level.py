"""GPT-2's byte-level BPE alphabet, shared by the golden scripts (pure Python, no packages)."""


def bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable character table (byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))
