"""``portable-ckpt convert SRC DST``: DCP / HF safetensors / torch.save ↔ portable."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from typing import Any

from portable_ckpt.cli import _args as A
from portable_ckpt.cli._output import progress_bar
from portable_ckpt.cli._text import safe
from portable_ckpt.format.vocab import CODECS

__all__ = ["register"]

_HELP = """\
Convert a checkpoint between formats in bounded memory (one batch of chunks at a time).

Formats (--from / --to):
{formats}

DST is a checkpoint root for portable (a new version is committed there); for the other targets
it must be new (an empty directory for dcp/hf) and appears only when the conversion succeeded.
It is built in a hidden .pck-staging-* directory beside DST; what a killed conversion left there
is removed by the next conversion to DST's directory once provably stale (its process gone, or,
from another host, nothing in it changed for an hour), and said (path, size, why).

Keys are mapped by default: DCP's dotted FQNs and nested torch.save dicts become the keys
portable_ckpt.torch.save writes for the same nested state (app/model/tok.weight), so
portable_ckpt.torch.load of the job's state finds them; the way back gives what stock dcp.load /
torch.load of that state looks up. --keys verbatim keeps the source's names.

The step of a new portable version is --step, else the one the source records (a step or
global_step value, a step-N / checkpoint-N name), else 0; the summary says which.

DCP's .metadata and non-tensor items are Python pickles. Unpickling runs code chosen by whoever
wrote the file, so DCP sources are refused unless you pass --trust-pickle. Even then nothing is
unpickled: the pickle opcodes are decoded symbolically (no import, no call) and only DCP's own
metadata classes are accepted; any other class or function is refused (PCK-UNSUPPORTED-VALUE).
The flag stays required because a pickle remains a format to accept only from people you trust.
(torch.save files are read the same way, with weights_only semantics.)

An item the target cannot hold (a DCP byte item that is pickled bytes, io.BytesIO or an object,
as torchtitan's dataloader state; a per-rank entry in a dcp or torch export) fails the
conversion, naming it, and nothing is written: a job resumed from the result would silently
miss it. Change it in the source, --select what the target holds, or pass --drop-unsupported
to convert the rest without it (each item dropped is a warning). --strict also refuses items
that would be changed.
"""


def _formats_help() -> str:
    from portable_ckpt.convert import FORMATS, source_formats, target_formats

    src, dst = set(source_formats()), set(target_formats())
    lines = []
    for name, fmt in FORMATS.items():
        roles = "/".join(r for r, ok in (("source", name in src), ("target", name in dst)) if ok)
        lines.append(
            textwrap.fill(
                f"{name:<9} ({roles}) {fmt.help}", width=96, initial_indent="  ",
                subsequent_indent=" " * 12,
            )
        )
    return "\n".join(lines)


def _dtype(text: str) -> str:
    """``--dtype``: a floating-point dtype an export casts to (checked while parsing)."""
    from portable_ckpt.convert._view import parse_dtype
    from portable_ckpt.errors import UsageError

    try:
        return parse_dtype(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


#: Names of checkpoint files, which no one gives a portable root by mistake of intent.
_FILE_NAMES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")


def _check(args: argparse.Namespace) -> str | None:
    """DST as the target format takes it (before anything is read)."""
    import os

    from portable_ckpt.convert._registry import url_problem
    from portable_ckpt.storage import local_path

    if args.dst_format is None:  # no --to: a portable root, unless DST is named as a file
        args.dst_format = "portable"
        local = local_path(args.dst)
        name = os.path.basename(os.path.normpath(args.dst)).lower()
        if local is not None and not os.path.lexists(local) and name.endswith(_FILE_NAMES):
            # `convert step-40.pt back.pt` (no --to torch) made a directory back.pt holding a
            # root, exit 0, and a pipeline's torch.load(back.pt) failed later (conv30 F5)
            return (
                f"argument DST: {args.dst} is named as a file, but the target is a portable root "
                "(a directory; --to defaults to portable): pass --to torch for a torch.save "
                "file (--to hf for a directory of safetensors), or --to portable for a root of "
                "that name"
            )
    problem = url_problem(args.dst, args.dst_format, "destination")
    if problem:
        return f"argument DST: {problem}"
    if args.dst_format != "torch":
        try:
            A.new_root(args.dst)  # a root or a new directory
        except argparse.ArgumentTypeError as e:
            return f"argument DST: {e}"
        return None
    local = local_path(args.dst)
    if local is not None and os.path.lexists(local):
        return f"argument DST: {args.dst} exists; a torch target is a new file (nothing is overwritten)"
    return None


def _run(args: argparse.Namespace) -> int:
    from portable_ckpt.convert import convert
    from portable_ckpt.convert.hf import parse_size

    with progress_bar(args, "convert") as progress:
        report = convert(
            args.src,
            args.dst,
            src_format=args.src_format,
            dst_format=args.dst_format,
            trust_pickle=args.trust_pickle,
            strict=args.strict,
            drop_unsupported=args.drop_unsupported,
            max_shard_size=args.max_shard_size,
            step=args.step,
            codec=args.codec,
            keys=args.keys,
            select=args.select or (),
            strip_prefix=args.strip_prefix,
            dtype=args.dtype,
            progress=progress,
            allow_expand=args.allow_expand,
            max_output_bytes=None if args.max_output is None else parse_size(args.max_output),
        )
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0
    for w in report.warnings:
        print(f"warning: {safe(w.item)}: {safe(w.message)}", file=sys.stderr)
    rate = report.bytes / max(report.seconds, 1e-9) / (1 << 20)
    print(
        f"converted {report.source_format} -> {report.target_format}: {report.tensors} tensors, "
        f"{report.chunks} chunks, {report.entries} entries, {report.bytes:,} bytes in "
        f"{report.seconds:.2f} s ({rate:,.0f} MiB/s) -> {safe(report.destination)}"
    )
    if report.step is not None:
        print(f"step {report.step} (from {safe(report.step_source)})")
    return 0


def register(subparsers: Any) -> None:
    """Add the ``convert`` subcommand (format choices from the conversion registry)."""
    from portable_ckpt.convert import source_formats, target_formats

    p = subparsers.add_parser(
        "convert",
        help="convert DCP / HF safetensors / torch.save checkpoints to and from the portable format",
        description=_HELP.format(formats=_formats_help()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "src", metavar="SRC", type=A.root_url, help="source checkpoint (file or directory)"
    )
    p.add_argument(
        "dst", metavar="DST", type=A.root_url,
        help="destination (portable root, or a new directory or file)",
    )
    p.add_argument(
        "--from", dest="src_format", choices=source_formats(), default=None,
        help="source format (default: detected)",
    )
    p.add_argument(
        "--to", dest="dst_format", choices=target_formats(), default=None,
        help="target format (default: portable; then a new DST named *.pt, *.bin, *.safetensors, ... is refused)",
    )
    _add_reading_options(p)
    _add_writing_options(p)
    p.add_argument("--json", action="store_true", help="print a JSON summary (tensors, bytes, seconds)")
    p.set_defaults(func=_run, check=_check)


def _add_reading_options(p: argparse.ArgumentParser) -> None:
    """How the source is read: trust, strictness, keys, expansion and output bounds."""
    p.add_argument(
        "--trust-pickle", action="store_true",
        help="accept DCP sources, whose .metadata and byte items are pickles (which can run "
        "arbitrary code when unpickled); they are decoded without running any, allowing only "
        "DCP's metadata classes — still, only use it for checkpoints you trust",
    )
    p.add_argument(
        "--drop-unsupported", action="store_true",
        help="convert without the items the target cannot hold (pickled bytes or objects of a "
        "DCP or torch.save source, per-rank entries in a dcp/torch export, non-tensor entries in "
        "an hf one), each named in a warning; without it they fail the conversion (exit 1, "
        "nothing written)",
    )
    p.add_argument(
        "--strict", action="store_true",
        help="fail (exit 1, nothing written) also when anything would be changed (a contract "
        "made statistical, one rank's value kept, ...); not with --drop-unsupported",
    )
    p.add_argument(
        "--keys", choices=["mapped", "verbatim"], default="mapped",
        help="mapped (default): DCP FQNs / nested torch.save dicts <-> portable_ckpt.torch keys; "
        "verbatim: keep the source's names",
    )
    p.add_argument(
        "--allow-expand", action="store_true",
        help="torch source: materialise tensor views that repeat stored elements (expand, zero "
        "or overlapping strides) instead of refusing them",
    )
    p.add_argument(
        "--max-output", metavar="SIZE", type=A.shard_size, default=None,
        help="most tensor bytes to write, e.g. 100GB (default: 4x the source's bytes + 1 GiB); "
        "checked before anything is written",
    )


def _add_writing_options(p: argparse.ArgumentParser) -> None:
    """What the target gets: the export's selection, names, dtype, shards, step and codec."""
    p.add_argument(
        "--select", action="append", metavar="PATTERN",
        help="exports from portable: only tensors and entries whose key matches this glob "
        "(repeatable), e.g. 'model/*'",
    )
    p.add_argument(
        "--strip-prefix", default=None, metavar="PREFIX",
        help="exports from portable: remove PREFIX from exported names, e.g. model/",
    )
    p.add_argument(
        "--dtype", type=_dtype, default=None,
        help="exports from portable: cast floating-point tensors (bf16, fp16, fp32, fp64)",
    )
    p.add_argument(
        "--max-shard-size", type=A.shard_size, default="5GB",
        help="hf target: largest shard, e.g. 5GB (10^9 bytes, as transformers), 2GiB (default 5GB)",
    )
    p.add_argument("--step", type=A.step, default=None, help="step of the new portable version / portable version to read")
    p.add_argument("--codec", choices=CODECS, default="none", help="portable target codec")
