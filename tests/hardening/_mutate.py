"""Mutation engine shared by the CI fuzz tests and bench/fuzz_long.py.

Everything is driven by a ``random.Random`` so that hypothesis (``st.randoms``) and the long-run
fuzzer (seeded ``Random``) use the same mutators and every failure is reproducible from a seed.
"""

from __future__ import annotations

import json
import os
import random
import struct
from typing import Any

#: Values substituted into JSON documents: boundary integers, wrong types, unsafe paths, huge shapes.
HOSTILE_VALUES: list[Any] = [
    -1, 0, 1, 7, 2**31, 2**32 + 1, 2**40, 2**53 - 1, 2**53, 2**62, 2**63, 2**64, 10**30, -(2**63),
    0.5, -0.0, 1e308, True, False, None, "", "x", "../../etc/passwd", "/etc/passwd", "data\\w.st",
    "data/../../x", "data/./w", "data//w", "a" * 5000, "\u0000", "\udcff", "é", "s000000000001",
    "F32", "U8", "zstd", "none", "float32", "bfloat16", "per_rank", "global", "crc32c",
    [], {}, [0], [2**40], [2**40, 2**40], [0, 2**53 - 1, 2**53 - 1], [1] * 9, [-1], [0.5],
    [[[[[]]]]], {"a": 1}, {"id": "pck:json/1"}, {"json_schema": {"type": "string"}},
]

#: Raw text fragments that strict JSON loading must refuse (or accept consistently).
TEXT_FRAGMENTS: list[bytes] = [
    b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"1" * 5000, b"\xff", b"\xc0\x80",
    b"\xed\xa0\x80", b'"\\ud800"', b"[" * 3000, b"{" * 100, b'"a":1,"a":2', b"\x00", b"//", b"'x'",
    b"0x10", b"01", b"1.", b".5", b"+1", b"\"\t\"", b"[1,]", b"{,}", b"\xef\xbb\xbf",
]


def json_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location in a JSON document (dict keys and list indexes), the root included."""
    out = [prefix]
    stack = [(doc, prefix)]
    while stack:
        node, p = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            q = (*p, k)
            out.append(q)
            if isinstance(v, dict | list):
                stack.append((v, q))
    return out


def _hostile(rng: random.Random) -> Any:
    # Always a fresh copy: inserting the shared constant and mutating it later made the
    # constants themselves cyclic (a harness bug, seen after ~89,000 inputs of a long run).
    return json.loads(json.dumps(rng.choice(HOSTILE_VALUES)))


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def mutate_json(doc: Any, rng: random.Random, n: int | None = None) -> Any:
    """Apply ``n`` (default 1–3) structural mutations to a deep copy of ``doc``."""
    doc = json.loads(json.dumps(doc))
    for _ in range(n if n is not None else rng.randint(1, 3)):
        paths = json_paths(doc)
        path = rng.choice(paths)
        kind = rng.randrange(7)
        if not path:
            if kind == 0:
                doc = _hostile(rng)
            continue
        parent = _get(doc, path[:-1])
        key = path[-1]
        if not isinstance(parent, dict | list):
            continue
        if kind <= 2:  # replace with a hostile value
            parent[key] = _hostile(rng)
        elif kind == 3:  # delete
            del parent[key]
        elif kind == 4:  # add an unknown field or item
            if isinstance(parent, dict):
                parent[rng.choice(["x", "extra", "../x", "__metadata__", "size"])] = _hostile(rng)
            else:
                parent.append(_hostile(rng))
        elif kind == 5:  # integer nudges (off-by-one, sign, scale)
            v = parent[key]
            if isinstance(v, int) and not isinstance(v, bool):
                parent[key] = rng.choice([v + 1, v - 1, -v, v * 2**20, v + 2**53, 0])
            elif isinstance(v, list) and v and all(isinstance(x, int) for x in v):
                i = rng.randrange(len(v))
                v[i] = rng.choice([v[i] + 1, v[i] - 1, 2**40, 0, -1])
        else:  # rename a key (dict) / duplicate an element (list)
            if isinstance(parent, dict):
                parent[str(key) + rng.choice(["", "/..", "\\", " "])] = parent.pop(key)
            else:
                parent.insert(key, parent[key])
    return doc


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Apply 1–4 byte-level mutations: flips, inserts of hostile fragments, deletes, truncation."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        pos = rng.randrange(len(b) + 1)
        if kind == 0 and b:
            i = min(pos, len(b) - 1)
            b[i] ^= 1 << rng.randrange(8)
        elif kind == 1 and b:
            i = min(pos, len(b) - 1)
            b[i] = rng.randrange(256)
        elif kind == 2:
            b[pos:pos] = rng.choice(TEXT_FRAGMENTS)
        elif kind == 3:
            del b[pos : pos + rng.randint(1, 16)]
        elif kind == 4:
            del b[pos:]
        else:  # duplicate a slice (creates duplicate keys in JSON text)
            j = rng.randrange(len(b) + 1)
            lo, hi = sorted((pos, j))
            b[hi:hi] = b[lo : min(hi, lo + 200)]
    return bytes(b)


def mutate_text_doc(doc: Any, rng: random.Random) -> bytes:
    """A JSON document mutated at the structure level, the text level, or both."""
    mode = rng.randrange(3)
    if mode == 0:
        return json.dumps(mutate_json(doc, rng), ensure_ascii=False).encode("utf-8", "surrogatepass")
    text = json.dumps(doc).encode()
    if mode == 1:
        return mutate_bytes(text, rng)
    return mutate_bytes(
        json.dumps(mutate_json(doc, rng), ensure_ascii=False).encode("utf-8", "surrogatepass"), rng
    )


HEADER_LENGTHS = [0, 1, 7, 2**31, 2**62, 2**64 - 1, 100_000_001, 100_000_000]


def mutate_safetensors(data: bytes, rng: random.Random) -> bytes:
    """Mutate a safetensors file: its length field, its JSON header (structure or text), or data."""
    n = struct.unpack("<Q", data[:8])[0]
    header, rest = data[8 : 8 + n], data[8 + n :]
    kind = rng.randrange(5)
    if kind == 0:
        value = rng.choice([*HEADER_LENGTHS, len(data) - 8, len(data) - 7, n + 1, n - 1])
        return struct.pack("<Q", value % 2**64) + data[8:]
    if kind == 1:
        new = mutate_text_doc(json.loads(header), rng)
        return struct.pack("<Q", len(new)) + new + rest
    if kind == 2:
        new = mutate_text_doc(json.loads(header), rng)
        return struct.pack("<Q", n) + new[:n].ljust(n, b" ") + rest  # keep the length field
    if kind == 3:
        return data[: rng.randrange(len(data) + 1)]
    return mutate_bytes(data, rng)


def checkpoint_files(version_dir: str) -> list[str]:
    """Relative paths of the regular files of a version directory."""
    out = []
    for d, _, files in os.walk(version_dir):
        for f in files:
            out.append(os.path.relpath(os.path.join(d, f), version_dir))
    return sorted(out)


def mutate_version(version_dir: str, rng: random.Random, outside: str) -> str:
    """Damage a copy of a committed version in place; return a description of what was done.

    ``outside`` is a directory outside the version that symlinks may point to.
    """
    files = checkpoint_files(version_dir)
    kind = rng.randrange(10)
    man = os.path.join(version_dir, "manifest.json")
    if kind <= 2:  # structural manifest mutation
        doc = json.loads(open(man, "rb").read())
        with open(man, "wb") as f:
            f.write(json.dumps(mutate_json(doc, rng), ensure_ascii=False).encode("utf-8", "surrogatepass"))
        return "manifest-json"
    if kind == 3:  # text-level manifest mutation
        data = open(man, "rb").read()
        with open(man, "wb") as f:
            f.write(mutate_bytes(data, rng))
        return "manifest-bytes"
    if kind == 4:  # consistent shape scaling: a tensor claims a huge or odd shape with matching range
        doc = json.loads(open(man, "rb").read())
        key = rng.choice(sorted(doc["tensors"]))
        t = doc["tensors"][key]
        if t["shape"]:
            d = rng.randrange(len(t["shape"]))
            new = rng.choice([2**40, 2**31, 0, 2**53 - 1])
            t["shape"][d] = new
            if new == 0:
                t["ranges"] = []
            else:
                for r in t["ranges"]:
                    r["lengths"][d] = new
                    r["offsets"][d] = 0
                t["ranges"] = t["ranges"][:1]
        with open(man, "wb") as f:
            f.write(json.dumps(doc).encode())
        return f"shape-scale {key}"
    target = rng.choice([f for f in files if f != "manifest.json"])
    full = os.path.join(version_dir, target)
    if kind == 5 and target.endswith(".safetensors"):
        data = open(full, "rb").read()
        with open(full, "wb") as f:
            f.write(mutate_safetensors(data, rng))
        return f"safetensors {target}"
    if kind == 6:  # symlinks out of the attempt (file or directory)
        if rng.random() < 0.5:
            os.unlink(full)
            os.symlink(os.path.join(outside, "secret.bin"), full)
            return f"file-symlink {target}"
        d = os.path.dirname(full)
        tmp = d + ".moved"
        os.rename(d, tmp)
        os.symlink(tmp, d)
        return f"dir-symlink {os.path.dirname(target)}"
    if kind == 7:  # truncate / extend
        size = os.path.getsize(full)
        os.truncate(full, rng.choice([0, 7, 8, max(0, size - 1), size // 2, size + 1]))
        return f"truncate {target}"
    data = open(full, "rb").read()
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    with open(full, "wb") as f:
        f.write(bytes(b))
    return f"bitflip {target}"
