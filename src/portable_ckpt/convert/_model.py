"""The neutral description of a source checkpoint that every reader produces and every sink eats.

A source is a list of tensors, each with its stored chunks (box + a loader that reads just that
chunk), plus non-tensor entries with JSON values. Loaders are called one at a time by the sink, so
a conversion holds at most one batch of chunks in memory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from portable_ckpt.errors import CheckpointError, LimitError, UnsupportedValueError
from portable_ckpt.format.keys import MAX_KEY, is_key
from portable_ckpt.format.manifest import MAX_SIZE
from portable_ckpt.ranges import Box, check_coverage

__all__ = [
    "MAP_MIN_BYTES",
    "ChunkSpec",
    "ConvertOptions",
    "ConvertWarning",
    "EntrySpec",
    "KeyMode",
    "SourcePlan",
    "TensorSpec",
    "WriteResult",
    "check_layout",
    "check_plan",
    "fail_if_lost",
    "refuse_shared_keys",
    "fail_if_strict",
    "name_lost",
    "infer_step",
    "short_number",
    "short_text",
    "to_json_value",
]

#: Source tensors smaller than this are read into fresh buffers instead of mapped: every mapping
#: holds a duplicate of the file descriptor (Python's ``mmap`` dups it) until the writer drops
#: the array, and the writer holds up to two batches (2 x 64 MiB) of them: mapping thousands of
#: small tensors ran out of descriptors (EMFILE). With this floor at most ~128 mappings are
#: alive, and copying tensors this small costs nothing. The safetensors, torch.save and DCP
#: readers share it (``_torchzip.load_torch_tensor``).
MAP_MIN_BYTES = 1 << 20

#: How keys cross formats: ``mapped`` (the key rule of ``portable_ckpt.torch`` ↔ DCP's FQNs and
#: nested ``torch.save`` dicts) or ``verbatim`` (names as the source spells them).
KeyMode = Literal["mapped", "verbatim"]


@dataclass(frozen=True, kw_only=True)
class ConvertOptions:
    """What a conversion was asked for (every reader and writer gets the same object).

    Attributes:
        trust_pickle: DCP sources: allow reading their pickles (decoded symbolically).
        strict: fail, before anything is published, on anything not converted as it is.
        drop_unsupported: convert without the items the target cannot hold (each one a
            ``skipped`` warning) instead of failing on them; refused with ``strict``.
        step: portable source: the version to read; portable target: the new version's step.
        keys: key mapping between formats (:data:`KeyMode`).
        codec: portable target: ``"none"`` or ``"zstd"``.
        max_shard_size: HF target: largest shard in bytes.
        select: export only tensors and entries whose key matches one of these globs.
        strip_prefix: remove this prefix from exported keys (keys without it are kept).
        dtype: cast floating-point tensors to this format dtype name on export.
        batch_bytes: bytes of chunks held in memory before they are written.
        allow_expand: ``torch.save`` sources: materialise views that repeat stored elements.
        max_output_bytes: the most tensor bytes a source may plan (``None``: the default bound
            of :func:`portable_ckpt.convert.open_source`).

    """

    trust_pickle: bool = False
    strict: bool = False
    drop_unsupported: bool = False
    step: int | None = None
    keys: KeyMode = "mapped"
    codec: str = "none"
    max_shard_size: int = 5 * 10**9
    select: tuple[str, ...] = ()
    strip_prefix: str | None = None
    dtype: str | None = None
    batch_bytes: int = 64 << 20
    allow_expand: bool = False
    max_output_bytes: int | None = None


@dataclass
class ChunkSpec:
    """One stored chunk of a tensor.

    Attributes:
        offsets: the chunk's offsets in the global tensor.
        lengths: the chunk's shape.
        nbytes: bytes of the chunk's elements.
        where: file (and item) it is stored in, for messages.
        load: returns the chunk as a numpy array of shape ``lengths`` (any strides).

    """

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    nbytes: int
    where: str
    load: Callable[[], np.ndarray[Any, Any]]


@dataclass
class TensorSpec:
    """A tensor of the source: key, format dtype name, global shape and its chunks."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    chunks: list[ChunkSpec]


@dataclass
class EntrySpec:
    """A non-tensor value of the source, stored as an entry with ``schema`` (default any JSON).

    ``schema`` is a built-in id or a schema document (``{"id": ...}`` or
    ``{"json_schema": ...}``). A ``per_rank`` entry is one spec per rank (``rank`` set, the same
    ``world_size_policy`` on each); ``compress`` stores the value as ``json+zstd``.
    """

    name: str
    value: Any
    schema: str | dict[str, Any] = "pck:json/1"
    scope: Literal["global", "per_rank"] = "global"
    rank: int | None = None
    world_size_policy: str | None = None
    compress: bool = False


@dataclass
class ConvertWarning:
    """Something the conversion skipped or changed, reported in the summary.

    ``kind`` is ``"skipped"`` (not converted), ``"changed"`` (converted with a loss, e.g. one
    rank's value of a per-rank entry) or ``"note"`` (how it was converted; nothing lost).
    A conversion fails on ``skipped`` ones unless ``drop_unsupported``; ``strict`` conversions
    fail on ``changed`` ones too.
    """

    item: str
    message: str
    kind: Literal["skipped", "changed", "note"] = "skipped"

    def to_json(self) -> dict[str, str]:
        """Return ``{"item": ..., "message": ..., "kind": ...}``."""
        return {"item": self.item, "message": self.message, "kind": self.kind}

    @property
    def loses(self) -> bool:
        """Whether something of the source is not in the result as it was."""
        return self.kind != "note"


@dataclass
class WriteResult:
    """What a target writer wrote: tensors, bytes of elements, entries, warnings."""

    tensors: int
    bytes: int
    entries: int = 0
    warnings: list[ConvertWarning] = field(default_factory=list)


@dataclass
class SourcePlan:
    """Everything a sink needs to write a source."""

    format: str
    tensors: list[TensorSpec]
    entries: list[EntrySpec] = field(default_factory=list)
    warnings: list[ConvertWarning] = field(default_factory=list)
    world_size: int = 1
    close: Callable[[], None] = lambda: None
    #: The training step the source records (``None``: it says none), and where it says it.
    step: int | None = None
    step_source: str = ""
    #: A portable source's continuation record (kept by a portable target).
    continuation: Any = None
    #: The reader already checked every tensor with :func:`check_layout` (DCP, from
    #: ``.metadata`` before any chunk was read): :func:`check_plan` does not check it again.
    layout_checked: bool = False

    @property
    def total_bytes(self) -> int:
        """Return the bytes of all tensor elements."""
        return sum(c.nbytes for t in self.tensors for c in t.chunks)

    @property
    def largest_chunk(self) -> int:
        """Return the size in bytes of the largest stored chunk."""
        return max((c.nbytes for t in self.tensors for c in t.chunks), default=0)


def check_plan(plan: SourcePlan, src: str = "") -> None:
    """Check that every tensor's chunks cover it exactly once (before anything is written).

    ``src`` (the source, for messages) is named where a tensor has no chunk to name.

    Raises:
        CoverageGapError, CoverageOverlapError, RangeBoundsError: the layout is broken; the
            message names the tensor and the files of its chunks.
        LimitError: a dimension above the format's limit.
        UnsupportedValueError: a name that is no portable key.

    """
    for t in plan.tensors:
        files = sorted({c.where for c in t.chunks}) or [src]
        where = ", ".join(f for f in files[:4] if f) or "the source"
        _check_key(t.key, where)
        if not plan.layout_checked:
            check_layout(
                t.key, t.shape, [Box.of(c.offsets, c.lengths) for c in t.chunks],
                where=where, damaged="the source", path=src or None,
                found=f"chunks stored in {where}",
            )


def check_layout(
    key: str,
    shape: tuple[int, ...],
    boxes: list[Box],
    *,
    where: str,
    damaged: str,
    path: str | None,
    found: str,
    lead: str = "",
) -> None:
    """Check tensor ``key``'s dimensions against the limit, and that ``boxes`` cover it once.

    ``boxes`` are its non-empty chunks. ``where`` starts a dimension refusal (``damaged`` says what is damaged: ``"the source"``);
    ``found`` is appended to a coverage refusal, in parentheses, and ``lead`` put before it.

    Raises:
        LimitError: a dimension above :data:`~portable_ckpt.format.manifest.MAX_SIZE`.
        CoverageGapError, CoverageOverlapError, RangeBoundsError: the chunks do not cover it.

    """
    big = [d for d in shape if d > MAX_SIZE]
    if big:
        raise LimitError(
            f"{where}: tensor {short_text(key)!r} has a dimension of {short_number(big[0])}, "
            f"above the format's limit of 2^53 - 1: {damaged} is damaged",
            path=path,
        )
    try:
        check_coverage(shape, boxes, key=key)
    except CheckpointError as exc:
        exc.reword(f"{lead}{exc.message} ({found})")
        if path is not None:
            exc.path = path
        raise


def short_number(n: int) -> str:
    """``n`` for a message: its digits, or their first and last few and their count."""
    text = str(n)
    return text if len(text) <= 24 else f"{text[:8]}…{text[-4:]} ({len(text)} digits)"


def short_text(text: str) -> str:
    """``text`` for a message: itself, or its start and its length."""
    return text if len(text) <= 80 else f"{text[:60]}… ({len(text):,} characters)"


def _check_key(key: str, where: str) -> None:
    """A source name the key rule turns into no portable key is the source's, not a usage error."""
    try:
        key.encode("utf-8")
        valid = is_key(key)
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 (every document is UTF-8)
        valid = False
    if valid:
        return
    raise UnsupportedValueError(
        f"{where}: source tensor {short_text(key)!r} cannot be stored: a portable key is "
        f"1–{MAX_KEY} characters of UTF-8 text without control characters; rename it in the "
        "source",
        path=where,
    )


#: Items a refusal names (then how many more there are).
_SHOWN = 5


def name_lost(lost: Sequence[ConvertWarning], *, source: str = "") -> str:
    """The first items of ``lost`` with their reasons, then how many more there are.

    ``source``: the file a refusal names already (left out of each reason, items quoted).
    """
    cut = f"{source}: " if source else ""
    shown = "; ".join(
        f"{f'item {w.item!r}' if source else w.item}: "
        f"{w.message.removeprefix(cut).removesuffix('; skipped')}" for w in lost[:_SHOWN])
    return shown + (f" (and {len(lost) - _SHOWN} more)" if len(lost) > _SHOWN else "")


def refuse_shared_keys(values: Iterable[str], tensors: Iterable[str], one_of_each: str) -> None:
    """Refuse a version whose tensor and entry share a name, for a target with one of each.

    ``one_of_each`` says why the target cannot hold both (``"a flat dict has one of each
    key"``): a torch export kept the value and lost the tensor, exit 0, and DCP's planner failed
    on an assertion (reatk31).

    Raises:
        UnsupportedValueError: naming the first such key.

    """
    if both := set(values) & set(tensors):
        raise UnsupportedValueError(
            f"key {min(both)!r} is both a tensor and an entry of the version, and {one_of_each}; "
            "nothing was written")


def fail_if_lost(
    warnings: Iterable[ConvertWarning], options: ConvertOptions, where: str, *,
    target: str | None = None,
) -> None:
    """Raise before publishing when the conversion would lose what ``options`` does not allow.

    Dropping an item (a ``skipped`` warning) fails unless ``options.drop_unsupported``: a job
    resumed from the result would silently miss it (its data position, say). With
    ``options.strict`` a ``changed`` item fails too. ``target`` names the format of an export
    (what it cannot hold is to be left out with ``--select``); without it the items are the
    source's values that the portable format cannot store.

    Raises:
        UnsupportedValueError: naming the first items lost and their number
            (``PCK-UNSUPPORTED-VALUE``), and the options that convert the rest.

    """
    if options.strict:
        lost = [w for w in warnings if w.loses]
    elif not options.drop_unsupported:
        lost = [w for w in warnings if w.kind == "skipped"]
    else:
        return
    if not lost:
        return
    shown, more = name_lost(lost), ""
    if options.strict:
        raise UnsupportedValueError(
            f"--strict: {len(lost)} item(s) would not be converted as they are, so nothing was "
            f"written to {where}: {shown}{more}. Drop --strict to convert the rest (with "
            "--drop-unsupported for items the target cannot hold)"
            + (", or --select what to export" if target is not None else ""),  # exports only
            path=where,
        )
    if target is None:
        what = "cannot be stored in the portable format"
        fix = ("Non-tensor values are stored as JSON data, never pickled: change them in the "
               "source (bytes or io.BytesIO to a base64 str or a uint8 tensor, an object to its "
               "state as JSON values)")
    else:
        what = f"have no place in a {target} target"
        fix = ("Export what it can hold with --select (`portable-ckpt inspect` lists the keys), "
               "or convert to a target that holds them")
    raise UnsupportedValueError(
        f"{len(lost)} item(s) {what} and would be dropped, so nothing was written to "
        f"{where}: {shown}{more}. {fix}; or pass --drop-unsupported (Python: "
        "drop_unsupported=True) to convert the rest without them, knowing that a job resumed "
        "from the result does not get them back",
        path=where,
    )


#: The name of :func:`fail_if_lost` before ``drop_unsupported`` (format plugins may call it).
fail_if_strict = fail_if_lost


def to_json_value(value: Any, depth: int = 0) -> Any:
    """Return the Python value ``value`` as plain JSON data, or raise ``ValueError``.

    Recognised: ``None``, bools, ints, floats (inf and nan too), strings, and lists/tuples/dicts (string or
    int keys; int keys become strings) of these. Tuples become lists.
    """
    if depth > 64:
        raise ValueError("nested too deeply")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)  # inf and nan too: encode_json tags them where they are stored
    if isinstance(value, list | tuple):
        return [to_json_value(v, depth + 1) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                if isinstance(k, int) and not isinstance(k, bool):
                    k = str(k)
                else:
                    raise ValueError(f"dict key {k!r} is not a string")
            out[k] = to_json_value(v, depth + 1)
        return out
    raise ValueError(f"value of type {type(value).__name__} is not JSON data")


#: Names of leaves that record the training step, most specific first.
_STEP_NAMES = ("step", "global_step")
#: Directory or file names that carry a step: ``step-100``, ``global_step100``, ``checkpoint-500``
#: (Hugging Face Trainer), ``iter_0000100`` (Megatron), ``step_100.pt``.
_STEP_DIR = re.compile(
    r"(?:^|[-_.])(?:step|global_step|checkpoint|iter|ckpt)[-_]?(\d{1,18})(?:\.[A-Za-z]+)?$"
)


def infer_step(leaves: Iterable[tuple[str, Any]], path: str) -> tuple[int | None, str]:
    """Return ``(step, where it came from)`` as a source records it, or ``(None, "")``.

    ``leaves`` are ``(name, value)`` pairs of the source's non-tensor values (names split on
    ``/`` or ``.``). The shallowest leaf named ``step`` (then ``global_step``) with a
    non-negative int value wins; several at that depth with different values say nothing.
    Otherwise the last component of ``path`` is matched against ``step-N``-style names, then,
    for a file, the directory holding it (``checkpoint-500/model.safetensors``).
    """
    best: dict[str, tuple[int, set[int]]] = {}
    for name, value in leaves:
        parts = re.split(r"[/.]", name)
        if parts[-1] not in _STEP_NAMES or isinstance(value, bool) or not isinstance(value, int):
            continue
        if value < 0:
            continue
        depth, values = best.get(parts[-1], (len(parts), set()))
        if len(parts) < depth:
            best[parts[-1]] = (len(parts), {value})
        elif len(parts) == depth:
            best[parts[-1]] = (depth, values | {value})
    for leaf in _STEP_NAMES:
        if leaf in best and len(best[leaf][1]) == 1:
            return next(iter(best[leaf][1])), f"the source's {leaf!r} value"
    base = os.path.basename(os.path.normpath(path))
    m = _STEP_DIR.search(base)
    if m:
        return int(m.group(1)), f"the source's name {base!r}"
    # The Trainer's checkpoint-500/ (and DeepSpeed's global_step100/) name the step of the
    # files they hold: the file alone gave step 0, its directory 500 (conv30 F2).
    if os.path.isfile(path):
        parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
        m = _STEP_DIR.search(parent)
        if m:
            return int(m.group(1)), f"the name of the source's directory {parent!r}"
    return None, ""
