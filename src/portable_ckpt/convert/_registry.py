"""The table of conversion formats: adding a format is one :class:`Format` entry.

Each entry names how to read the format into a :class:`~portable_ckpt.convert._model.SourcePlan`
(``reader``), how to write it from an opened portable version (``writer``), how to recognise it
on disk (``detect``), what it needs (``requires``, with the ``install`` hint shown when that is
missing) and a line of help. Readers and writers are ``"module:function"`` strings, imported on
first use, so the table imports nothing heavy (torch stays out of ``import portable_ckpt``).
The CLI's ``--from``/``--to`` choices and their help come from this table.

The portable format is the hub: every source is read into a plan that the portable sink writes,
every target is written from a portable version, and any other pair goes through a temporary
portable version.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from portable_ckpt.errors import NotFoundError, UsageError
from portable_ckpt.format.usage import flag
from portable_ckpt.storage import local_path
from portable_ckpt.storage._posix import file_kind, open_regular

__all__ = [
    "ENTRY_POINT_GROUP",
    "FORMATS",
    "Format",
    "detect_format",
    "get_format",
    "register_format",
    "say_skipped",
    "source_formats",
    "target_formats",
    "url_problem",
]

_log = logging.getLogger("portable_ckpt.convert")

#: What a format's destination is: a checkpoint root, a new directory, or a new file.
Destination = Literal["root", "directory", "file"]


@dataclass(frozen=True, kw_only=True)
class Format:
    """One conversion format.

    Attributes:
        name: the ``--from``/``--to`` value.
        help: one line for ``--help``.
        reader: ``"module:function"`` with the signature ``(src, options) -> SourcePlan``;
            ``None`` when the format cannot be a source.
        writer: ``"module:function"`` with the signature ``(checkpoint, dst, options,
            progress) -> WriteResult``; ``None`` when it cannot be a target (the portable
            format, the hub, is written by the portable sink).
        detect: ``(path) -> bool``: whether ``path`` (an existing local file or directory) is in
            this format; formats are tried in table order.
        destination: what ``DST`` is for this target.
        dotted_names: the target names tensors by dotted module paths (mapped keys are exported
            as DCP's FQN of the key: ``model/fc.weight`` → ``model.fc.weight``).
        read_requires: importable modules the reader needs.
        write_requires: importable modules the writer needs.
        install: what to install when one of them is missing.

    """

    name: str
    help: str
    reader: str | None = None
    writer: str | None = None
    detect: Callable[[str], bool] | None = None
    destination: Destination = "directory"
    dotted_names: bool = False
    read_requires: tuple[str, ...] = ()
    write_requires: tuple[str, ...] = ()
    install: str = ""

    def load(self, role: Literal["reader", "writer"]) -> Callable[..., Any]:
        """Import and return this format's reader or writer.

        Raises:
            UsageError: the format has no such role, or a module it needs is not installed.

        """
        ref = self.reader if role == "reader" else self.writer
        if ref is None:
            raise UsageError(f"format {self.name!r} cannot be a {'source' if role == 'reader' else 'target'}")
        needs = self.read_requires if role == "reader" else self.write_requires
        missing = [m for m in needs if importlib.util.find_spec(m) is None]
        if missing:
            raise UsageError(
                f"format {self.name!r} needs {', '.join(missing)}: {self.install or 'install it'}"
            )
        module, _, func = ref.partition(":")
        fn: Callable[..., Any] = getattr(importlib.import_module(module), func)
        return fn


# -- detection ------------------------------------------------------------------------------------

_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
#: Indexes of sharded torch.save sets (convert.torch_save.TORCH_INDEX_SUFFIXES; not imported
#: here: detection stays free of the readers' imports).
_TORCH_INDEXES = (".bin.index.json", ".pt.index.json", ".pth.index.json")


def _is_portable(p: str) -> bool:
    if not os.path.isdir(p):
        return False
    names = os.listdir(p)
    return "manifest.json" in names or any(
        os.path.isfile(os.path.join(p, n, "manifest.json")) for n in names if n.startswith("s")
    )


def _is_dcp(p: str) -> bool:
    from portable_ckpt.convert.dcp import is_dcp_dir

    return is_dcp_dir(p)


def _head(p: str, n: int) -> bytes:
    with os.fdopen(open_regular(p), "rb") as f:  # a FIFO is refused, never waited on
        return f.read(n)


def _is_zip(p: str) -> bool:
    from portable_ckpt.convert._torchzip import is_zip

    with os.fdopen(open_regular(p), "rb") as f:
        return is_zip(f)


def _is_torch_zip(p: str) -> bool:
    """A zip with a ``data.pkl`` member (``torch.save``'s layout; an ``.npz`` has none)."""
    from portable_ckpt.convert._torchzip import ZIP_ERRORS, is_zip

    with os.fdopen(open_regular(p), "rb") as f:
        if not is_zip(f):
            return False
        try:
            with zipfile.ZipFile(f) as z:
                return any(n == "data.pkl" or n.endswith("/data.pkl") for n in z.namelist())
        except ZIP_ERRORS:
            return True  # damaged: the torch reader says what is wrong with it


def _is_hf(p: str) -> bool:
    if os.path.isdir(p):
        names = os.listdir(p)
        if "model.safetensors" in names or any(n.endswith(".safetensors.index.json") for n in names):
            return True
        # transformers loads pytorch_model.bin or its index before other safetensors files: a
        # lone adapter_model.safetensors beside them was converted alone, exit 0 (reatk31 R4)
        if "pytorch_model.bin" in names or any(n.endswith(_TORCH_INDEXES) for n in names):
            return False
        return any(n.endswith(".safetensors") for n in names)
    if p.endswith((".safetensors", ".safetensors.index.json")):
        return True
    if p.endswith(_TORCH_SUFFIXES + _TORCH_INDEXES):
        return False
    if _is_zip(p):
        return False  # a torch.save archive without a suffix
    head = _head(p, 9)
    return len(head) == 9 and head[8:9] == b"{"  # u64 header length, then the JSON header


def _is_torch(p: str) -> bool:
    if os.path.isdir(p):
        # one file, or a sharded set with its index (transformers' pytorch_model.bin.index.json)
        names = os.listdir(p)
        return (any(n.endswith(_TORCH_INDEXES) for n in names)
                or len([n for n in names if n.endswith(_TORCH_SUFFIXES[:3])]) == 1)
    if p.endswith(_TORCH_SUFFIXES + _TORCH_INDEXES) or _is_torch_zip(p):
        return True
    return _head(p, 2) == b"\x80\x02"  # the legacy (non-zip) torch.save pickle


_TORCH_HINT = "pip install 'portable-ckpt[torch]'"

#: The formats, in detection order. Register more with :func:`register_format`.
FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format(
            name="portable",
            help="a portable_ckpt root or version (local or s3://); as a target a new version "
            "is committed in the root DST",
            reader="portable_ckpt.convert._portable:read_portable_source",
            detect=_is_portable,
            destination="root",
        ),
        Format(
            name="dcp",
            help="a torch.distributed.checkpoint directory (FileSystemWriter); reading needs "
            "--trust-pickle, writing needs torch",
            reader="portable_ckpt.convert.dcp:read_source",
            writer="portable_ckpt.convert.dcp:write_target",
            detect=_is_dcp,
            write_requires=("torch",),
            install=_TORCH_HINT,
        ),
        Format(
            name="hf",
            help="Hugging Face safetensors: model.safetensors, or shards with "
            "model.safetensors.index.json",
            reader="portable_ckpt.convert.hf:read_source",
            writer="portable_ckpt.convert.hf:write_target",
            detect=_is_hf,
            dotted_names=True,
        ),
        Format(
            name="torch",
            help="a torch.save file (.pt/.pth/.bin state dict), or shards with their "
            "pytorch_model.bin.index.json; as a target one file that "
            "torch.load(weights_only=True) reads",
            reader="portable_ckpt.convert.torch_save:read_source",
            writer="portable_ckpt.convert.torch_save:write_target",
            detect=_is_torch,
            destination="file",
            write_requires=("torch",),
            install=_TORCH_HINT,
        ),
    )
}

def register_format(fmt: Format, *, replace: bool = False) -> None:
    """Add ``fmt`` to the table (after the built-in formats in detection order).

    Raises:
        UsageError: ``fmt`` is no :class:`Format`, ``replace`` no bool, or a format of that
            name exists and ``replace`` is false.

    """
    if not isinstance(fmt, Format):  # (None was an AttributeError on .name)
        raise UsageError(
            f"register_format: fmt must be a portable_ckpt.convert.Format, got "
            f"{type(fmt).__name__} {fmt!r:.80}"
        )
    flag(replace, "register_format: replace")
    if fmt.name in FORMATS and not replace:
        raise UsageError(f"conversion format {fmt.name!r} is already registered")
    FORMATS[fmt.name] = fmt


#: Installed packages add formats through entry points of this group: the value is a
#: :class:`Format` (or a callable returning one); the CLI's choices then include them.
ENTRY_POINT_GROUP = "portable_ckpt.convert"
_installed_loaded = False
#: Why installed formats were skipped, said once by :func:`say_skipped` (the CLI builds its
#: choices before its log handler exists, so nothing is logged while loading).
_skipped: list[str] = []


def _load_installed() -> None:
    """Register the formats of installed packages once (after the built-ins, in name order).

    A broken or conflicting entry point is logged and skipped: one bad package must not take
    the conversion of every other format down with it.
    """
    global _installed_loaded
    if _installed_loaded:
        return
    _installed_loaded = True
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            fmt = ep.load()
            fmt = fmt() if callable(fmt) and not isinstance(fmt, Format) else fmt
            if not isinstance(fmt, Format):
                raise TypeError(f"it is a {type(fmt).__name__}, not a Format")
            if fmt.name in FORMATS:
                raise UsageError(f"a format named {fmt.name!r} exists")
            FORMATS[fmt.name] = fmt
        except Exception as exc:  # any failure of a third-party package: skipped, said
            _skipped.append(f"conversion format {ep.name!r} of entry point {ep.value} is "
                            f"skipped: {exc}")


def say_skipped() -> None:
    """Log, once, the installed formats that could not be registered (at a conversion's start)."""
    _load_installed()
    while _skipped:
        _log.warning("%s", _skipped.pop(0))


def source_formats() -> tuple[str, ...]:
    """Names of the formats that can be read (installed packages' included)."""
    _load_installed()
    return tuple(n for n, f in FORMATS.items() if f.reader is not None)


def target_formats() -> tuple[str, ...]:
    """Names of the formats that can be written (the portable hub first)."""
    _load_installed()
    return ("portable", *(n for n, f in FORMATS.items() if f.writer is not None))


def get_format(name: str, *, role: Literal["source", "target"]) -> Format:
    """Return the format ``name`` for ``role``.

    Raises:
        UsageError: no such format, or it cannot take that role (the message lists the choices).

    """
    choices = source_formats() if role == "source" else target_formats()
    if name not in choices:
        raise UsageError(f"unknown {role} format {name!r}; use one of {', '.join(choices)}")
    return FORMATS[name]


def url_problem(path: str, fmt: str, role: str) -> str | None:
    """Why ``path`` cannot be the ``role`` ("source"/"destination") of format ``fmt``, or ``None``.

    Only portable roots go through a storage backend; the other formats are local paths.
    """
    if fmt == "portable" or local_path(path) is not None:
        return None
    scheme = path.partition("://")[0]
    fix = (
        "convert to a local path and upload the result, or convert into a portable root there"
        if role == "destination"
        else "download it first, or convert from a portable root there"
    )
    return f"{role} {path}: a {fmt} {role} is a local path ({scheme}:// is for portable roots); {fix}"


def detect_format(path: str | os.PathLike[str]) -> str:
    """Guess the format of ``path`` (``s3://`` URLs are portable roots).

    Raises:
        NotFoundError: nothing at ``path``.
        UsageError: no format recognises it (pass it explicitly).

    """
    p = local_path(os.fspath(path))
    if p is None:  # an object store: only this format there
        return "portable"
    if not os.path.lexists(p):
        raise NotFoundError(f"source {p} does not exist", path=p)
    file_kind(p, what=f"source {p}")  # a FIFO or socket is refused before any format looks
    _load_installed()
    for fmt in FORMATS.values():
        if fmt.reader is not None and fmt.detect is not None and fmt.detect(p):
            return fmt.name
    kind = "file" if os.path.isfile(p) else "directory"
    raise UsageError(
        f"cannot tell the format of {kind} {p}; pass --from {'|'.join(source_formats())} "
        "(Python: src_format=...)"
    )
