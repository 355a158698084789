#!/usr/bin/env python3
"""Build docs/api/README.md, the API reference for third-party writers and readers, from the code.

Signatures come from :mod:`inspect`, text from the docstrings; nothing is written by hand, so the
reference cannot drift from the code: ``tests/test_api_reference.py`` fails when the committed
file differs from what this script produces. Run it after changing a documented signature or
docstring::

    ./dev python docs/api/generate.py
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["main", "render"]

OUT = Path(__file__).resolve().with_name("README.md")

#: (module, names, members of classes to document). The order is the order of the page.
SECTIONS: list[tuple[str, str, list[str]]] = [
    ("Opening and reading", "portable_ckpt", ["open", "save_arrays"]),
    ("", "portable_ckpt.io.reader", ["Checkpoint", "ReadRequest", "NO_VALUE", "ReadStats"]),
    ("Writing shards (one writer)", "portable_ckpt.io.writer", ["new_attempt_id", "ShardWriter"]),
    ("Committing a version", "portable_ckpt.io.commit", ["commit", "read_writer_index"]),
    ("Format records", "portable_ckpt.format.manifest",
     ["Continuation", "Mesh", "Manifest", "WriterIndex", "TensorEntry", "RangeRecord", "Entry",
      "EntryValue", "FileRecord"]),
    ("Storage", "portable_ckpt.storage", ["open_storage", "Storage", "StreamWriter",
                                          "Capabilities", "ObjectInfo", "LocalStorage",
                                          "register_scheme"]),
    ("Storage faults, for a backend's tests", "portable_ckpt.storage.faults",
     ["FaultyStorage", "Fault"]),
    ("Listing versions", "portable_ckpt.io.versions", ["list_versions"]),
    ("Retention", "portable_ckpt.io.gc", ["gc"]),
    ("Pins", "portable_ckpt.io.pins", ["pin", "unpin", "read_pins"]),
    ("Job log", "portable_ckpt.logs", ["get_logger", "log_event", "logged"]),
    ("Converting other formats", "portable_ckpt.convert", ["convert", "register_format"]),
    ("torch: the checkpoint manager", "portable_ckpt.torch",
     ["CheckpointManager", "ModelOptimizerState", "LoadInfo", "CheckpointInfo"]),
    ("torch: what a state holds", "portable_ckpt.torch",
     ["StateEntry", "DataPosition", "RNGState", "GeneratorState"]),
    ("torch: saving and loading without a manager", "portable_ckpt.torch",
     ["save", "async_save", "AsyncSaveHandle", "load", "as_tensor"]),
    ("torch: process groups for tests and drills", "portable_ckpt.torch.launch", ["run_group"]),
]

HEADER = """# API reference (generated)

The public Python API a third-party writer, committer or reader needs, generated from the code
by `docs/api/generate.py` (do not edit: run `./dev python docs/api/generate.py`). The format
itself is defined by [`spec/README.md`](../../spec/README.md); this page documents the reference
implementation, which is informative. torch users: [`docs/torch.md`](../torch.md) and the
`portable_ckpt.torch` sections at the end of this page. Storage
backends: [`docs/storage-backends.md`](../storage-backends.md).

A multi-process writer without torch: every process creates a `ShardWriter` for the agreed
attempt id (`new_attempt_id(step)`, chosen by one process and shared), adds its chunks and
entries, and calls `finish()`; one process then calls `commit(...)` with the expected writers
and the continuation, which it knows from the job, not from the attempt (spec R-COMMIT-5).
"""


_SECTIONS = ("Args:", "Arguments:", "Returns:", "Raises:", "Attributes:", "Yields:")


def _doc(obj: Any) -> str:
    """The docstring as Markdown: Google-style sections become bold titles and bullet lists."""
    out: list[str] = []
    for line in (inspect.getdoc(obj) or "(no docstring)").strip().splitlines():
        if line.strip() in _SECTIONS:
            out += ["", f"**{line.strip()}**", ""]
        elif line.startswith("        ") and out and out[-1].startswith("- "):
            out[-1] += " " + line.strip()
        elif line.startswith("    ") and ":" in line:
            head, _, rest = line.strip().partition(":")
            out.append(f"- `{head}`: {rest.strip()}" if " " not in head else f"- {line.strip()}")
        else:
            out.append(line)
    text = "\n".join(out).strip()
    text = re.sub(r":(?:class|func|meth|data|mod|attr|exc):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _annotation(a: Any) -> str:
    return a if isinstance(a, str) else inspect.formatannotation(a)


def _signature(name: str, obj: Any) -> str:
    """``name(params) -> ret`` with annotations as written in the source (no quotes)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    parts: list[str] = []
    star = False
    for p in sig.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        text = ("*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else "")
        star = star or p.kind is p.VAR_POSITIONAL
        text += p.name
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {p.default!r}"
        parts.append(text)
    ret = "" if sig.return_annotation is sig.empty else f" -> {_annotation(sig.return_annotation)}"
    return f"{name}({', '.join(parts)}){ret}"


def _members(cls: type) -> list[tuple[str, Any]]:
    out = []
    for name, value in cls.__dict__.items():
        if name.startswith("_") and name != "__init__":
            continue
        if name == "__init__" or not (inspect.isfunction(value) or isinstance(value, property)
                                      or isinstance(value, (staticmethod, classmethod))):
            continue
        out.append((name, value))
    return out


def _class(qual: str, cls: type) -> list[str]:
    lines = [f"### `{qual}`", "", "```python", f"class {_signature(cls.__name__, cls)}", "```",
             "", _doc(cls), ""]
    for name, member in _members(cls):
        if isinstance(member, property):
            lines += [f"- **`{name}`** (property) — {_doc(member).splitlines()[0]}"]
            continue
        fn = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
        lines += ["", f"#### `{cls.__name__}.{name}`", "", "```python",
                  f"def {_signature(name, fn)}", "```", "", _doc(fn)]
    return [*lines, ""]


def _item(module: str, name: str) -> list[str]:
    obj = getattr(importlib.import_module(module), name)
    qual = f"{module}.{name}"
    if inspect.isclass(obj):
        return _class(qual, obj)
    if inspect.isfunction(obj):
        return [f"### `{qual}`", "", "```python", f"def {_signature(name, obj)}", "```", "",
                _doc(obj), ""]
    return [f"### `{qual}`", "", f"A constant, `{obj!r}`: {_doc(type(obj))}", ""]


def _errors() -> list[str]:
    from portable_ckpt import errors

    lines = ["## Errors", "", _doc(errors), "",
             "Every error is a `portable_ckpt.errors.CheckpointError` with `code`, `message` and "
             "`path`; `errors.error_for_code(code)` maps a code back to its class.", "",
             "| class | code | meaning |", "|---|---|---|"]
    for code, cls in sorted(errors.ERROR_CODES.items()):
        lines.append(f"| `{cls.__name__}` | `{code}` | {_doc(cls).splitlines()[0]} |")
    return [*lines, ""]


def render() -> str:
    """The whole page."""
    lines = [HEADER]
    for title, module, names in SECTIONS:
        if title:
            lines += [f"## {title}", ""]
        for name in names:
            lines += _item(module, name)
    lines += _errors()
    text = "\n".join(line.rstrip() for line in "\n".join(lines).splitlines())
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write docs/api/README.md (``--check``: exit 1 if it is out of date)."""
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in args:
        return 0 if OUT.read_text(encoding="utf-8") == text else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

