"""Function sizes in code lines over a source tree (the measure our style review compares with zarr,
fsspec, safetensors and DCP: median, 90th percentile, functions over 50 and 100 lines).

    .venv/bin/python -m bench.code_health [paths ...] [--top N] [--over N] [--json]

Counted per function or method (``def``/``async def``): the lines of its body, from its first
statement to its last line, that hold code. Not counted: the docstring, blank lines, comment-only
lines, lines holding only closing brackets, commas or colons (the tail of a wrapped call), and the
lines of functions and classes nested in it (a nested function is counted on its own). The
signature and decorators are not counted either. Default paths: ``src``.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import statistics
import sys
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

_SKIPPED_TOKENS = (
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
)
_CLOSERS = frozenset({")", "]", "}", ",", ":"})
_Def = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class FunctionSize:
    """One function: where it is and how many code lines it has."""

    path: str
    line: int
    name: str
    code_lines: int


def code_lines(source: str) -> set[int]:
    """Line numbers holding a token other than a comment or closing punctuation."""
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in _SKIPPED_TOKENS or (tok.type == tokenize.OP and tok.string in _CLOSERS):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def _span(node: ast.AST) -> set[int]:
    start = getattr(node, "lineno", 0)
    return set(range(start, (getattr(node, "end_lineno", None) or start) + 1))


def _docstring(fn: _Def) -> set[int]:
    first = fn.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return _span(first)
    return set()


def _function_lines(fn: _Def, code: set[int]) -> int:
    lines = set(range(fn.body[0].lineno, (fn.end_lineno or fn.lineno) + 1)) - _docstring(fn)
    for inner in ast.walk(fn):
        if inner is not fn and isinstance(inner, (*_Def.__args__, ast.ClassDef)):
            lines -= _span(inner)
    return len(lines & code)


def measure_file(path: Path, root: Path) -> list[FunctionSize]:
    """Sizes of every function in one file."""
    source = path.read_text(encoding="utf-8")
    code = code_lines(source)
    rel = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    return [
        FunctionSize(rel, fn.lineno, fn.name, _function_lines(fn, code))
        for fn in ast.walk(ast.parse(source))
        if isinstance(fn, _Def.__args__)
    ]


def _files(paths: Iterable[Path]) -> Iterator[Path]:
    for p in paths:
        yield from sorted(p.rglob("*.py")) if p.is_dir() else [p]


def summary(sizes: list[FunctionSize], over: tuple[int, ...] = (50, 100)) -> dict[str, float]:
    """Count, median, p90 and the numbers of functions above each of ``over``."""
    n = sorted(s.code_lines for s in sizes)
    if not n:
        return {"functions": 0}
    p90 = statistics.quantiles(n, n=10, method="inclusive")[-1] if len(n) > 1 else float(n[0])
    out: dict[str, float] = {"functions": len(n), "median": statistics.median(n), "p90": p90}
    for limit in over:
        out[f"over_{limit}"] = sum(x > limit for x in n)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0].replace("\n", " "))
    ap.add_argument("paths", nargs="*", default=["src"], help="files or directories")
    ap.add_argument("--top", type=int, default=15, help="list the N largest functions")
    ap.add_argument("--over", type=int, default=None, help="list every function above N lines")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    root = Path.cwd()
    sizes = [
        s for f in _files(Path(p).resolve() for p in args.paths) for s in measure_file(f, root)
    ]
    biggest = sorted(sizes, key=lambda s: -s.code_lines)
    listed = (
        [s for s in biggest if s.code_lines > args.over]
        if args.over is not None
        else biggest[: args.top]
    )
    if args.json:
        print(
            json.dumps(
                {"summary": summary(sizes), "largest": [asdict(s) for s in listed]}, indent=2
            )
        )
        return 0
    print("  ".join(f"{k} {v:g}" for k, v in summary(sizes).items()))
    for s in listed:
        print(f"{s.code_lines:>5}  {s.path}:{s.line} {s.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
