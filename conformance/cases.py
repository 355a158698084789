"""The logical states the writer harness saves, and the faults it injects (hypothesis strategies).

A :class:`SaveCase` is one logical training state split among writers; a :class:`CrashCase` is
a committed state A followed by an attempt at a state B broken by one fault point of
:data:`FAULT_POINTS`. Both serialise to JSON (:func:`case_to_json`, :func:`case_from_json`): a
case directory's ``case.json`` is what ``writer --replay`` runs again.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

from conformance.spec import DTYPES

__all__ = [
    "COMMIT_FAULTS",
    "CONTINUATIONS",
    "EXERCISE_BLOCKS",
    "EXERCISE_EMPTY",
    "EXERCISE_NAME",
    "FAULT_POINTS",
    "RANK_KINDS",
    "STRATUM_RANKS",
    "TABLE_MODES",
    "WRITE_FAULTS",
    "CrashCase",
    "EntrySpec",
    "SaveCase",
    "TensorSpec",
    "case_from_json",
    "case_to_json",
    "continuation",
    "crash_cases",
    "exercising",
    "new_attempt_id",
    "rank_writer",
    "save_cases",
]

_CONTROL = "".join(chr(i) for i in range(32)) + "\x7f"
WRITE_FAULTS = ("before_data", "mid_data", "after_data")
COMMIT_FAULTS = ("before_publish", "temp_written")
#: every fault point of an atomic-publish case; each runs at least once per run (stratified).
FAULT_POINTS: tuple[str, ...] = (*(f"write:{p}" for p in WRITE_FAULTS),
                                 *(f"commit:{p}" for p in COMMIT_FAULTS),
                                 "kill-writer", "kill-commit")
#: how often save cases ask for a tensor table: never, sometimes (hypothesis draws), always.
TABLE_MODES = ("never", "sometimes", "always")


@dataclass
class TensorSpec:
    """A logical tensor, its full data and how it is split among writers."""

    key: str
    dtype: str
    shape: list[int]
    seed: int
    boxes: list[tuple[list[int], list[int], int]]  # (offsets, lengths, writer)
    declared_by: int = 0  # writer that declares a zero-size tensor

    def data(self) -> np.ndarray:
        """Full tensor as uint8 array of shape ``shape + [itemsize]`` (C order, little endian)."""
        isz = DTYPES[self.dtype][1]
        n = math.prod(self.shape) * isz
        raw = np.random.default_rng(self.seed).integers(0, 256, size=n, dtype=np.uint8)
        if self.dtype == "bool":
            raw &= 1
        return raw.reshape(*self.shape, isz)


@dataclass
class EntrySpec:
    """A non-tensor entry: global (``value``) or per_rank (``values[rank]``)."""

    name: str
    schema: dict[str, Any]
    scope: str
    encoding: str
    value: Any = None
    values: list[Any] = field(default_factory=list)
    policy: str | None = None
    writer: int = 0  # writer that stores a global entry


@dataclass
class SaveCase:
    """One logical state to save."""

    step: int
    num_writers: int
    codec: str
    tensors: list[TensorSpec]
    entries: list[EntrySpec]
    tensor_table: bool = False  # ask the writer for a tensor table (format 1.1, §8.5)
    table_codec: str = "none"  # codec of that table
    contract: str = "exact"  # the commit job's continuation contract (§13)
    mesh: dict[str, Any] | None = None  # the commit job's mesh: {"shape", "dim_names"} or None
    #: the saving job's world size (``continuation.world_size``); None: one rank per writer.
    #: It is a fact of its own (R-COMMIT-5, R-CONTRACT-1): one writer per node stores the
    #: state of several ranks, and a job may run writers that are not ranks.
    world_size: int | None = None

    def ranks(self) -> int:
        """The saving job's world size: every per-rank entry has one value per rank (R-ENTRY-8)."""
        return self.num_writers if self.world_size is None else self.world_size

    def continuation(self) -> dict[str, Any]:
        """The commit job's ``continuation``, which the committer records as given (§13)."""
        return {"contract": self.contract, "world_size": self.ranks(), "mesh": self.mesh}

    def summary(self) -> str:
        """Short description for failure messages."""
        ts = ", ".join(f"{t.key!r}:{t.dtype}{t.shape}/{len(t.boxes)}box" for t in self.tensors)
        es = ", ".join(f"{e.name}:{e.scope}/{e.encoding}" for e in self.entries)
        tt = f" tensor_table={self.table_codec}" if self.tensor_table else ""
        mesh = f" mesh={self.mesh['shape']}" if self.mesh else ""
        ws = f" world_size={self.ranks()}" if self.ranks() != self.num_writers else ""
        return (f"step={self.step} writers={self.num_writers}{ws} codec={self.codec}{tt} "
                f"contract={self.contract}{mesh} tensors=[{ts}] entries=[{es}]")


@dataclass
class CrashCase:
    """A committed state A, then an attempt at B broken by ``fault``."""

    first: SaveCase
    second: SaveCase
    fault: str  # one of FAULT_POINTS
    victim: int  # the writer that fails or is killed
    at: float = 0.5  # kills: where in the victim's progress, 0 (first event) .. 1 (last)


def new_attempt_id(step: int) -> str:
    """A fresh attempt id per the spec's pattern (R-ID-1, R-ID-2)."""
    t = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + f"{int(t % 1 * 1e6):06d}Z"
    return f"s{step:012d}-{stamp}-{secrets.token_hex(8)}"


# --------------------------------------------------------------------------------- strategies
#: the continuations a codec stratum's case asks for, by stratum: (contract, with a mesh). The
#: first stratum asks for what a committer that ignores the job would not write (a statistical
#: contract and a mesh), the second for the plain default; random cases draw both.
CONTINUATIONS: tuple[tuple[str, bool], ...] = (("statistical", True), ("exact", False))
#: how the saving job's world size relates to its writers (R-COMMIT-5: two facts of the job):
#: one rank per writer; fewer ranks than writers (writers numbered ``world_size`` and above store
#: no per-rank value); more ranks than writers (ranks that do not write, or one writer per node).
#: A write job gives writer ``w`` rank ``w`` of every per-rank entry (the protocol), so "more" is
#: drawn without per-rank entries; the committer case ``world-size-not-writers`` hands the
#: committer an index that holds the values of several ranks.
RANK_KINDS: tuple[str, ...] = ("writers", "fewer", "more")
#: the rank kind of each codec stratum's case, in turn: the first asks for more ranks than
#: writers (with its statistical contract and mesh), so that every run commits a job whose world
#: size is not its number of writers (a committer that took one for the other passed every
#: case: outside review 21b, finding 1).
STRATUM_RANKS: tuple[str, ...] = ("more", "writers")
_DIM_NAMES = ("dp", "tp", "pp")


def rank_writer(rank: int, num_writers: int) -> int:
    """The writer that stores ``rank``'s value of a per-rank entry: ``rank mod num_writers``.

    Rank ``r`` is writer ``r``'s while there are as many writers; with more ranks than writers,
    the extra ranks' values are stored by the writers in turn (one writer per node).
    """
    return rank % num_writers


def continuation(world_size: int, split: int) -> dict[str, Any]:
    """A mesh of ``world_size`` ranks (R-CONTRACT-2): 1-d, or 2-d when ``split`` divides it.

    ``split`` (>= 1) picks the first dimension: ``[split, world_size // split]`` when ``split``
    is a proper divisor, ``[world_size]`` otherwise.
    """
    if 1 < split < world_size and world_size % split == 0:
        return {"shape": [split, world_size // split], "dim_names": list(_DIM_NAMES[:2])}
    return {"shape": [world_size], "dim_names": [_DIM_NAMES[0]]}


def _partition(draw: Any, shape: list[int]) -> list[tuple[list[int], list[int]]]:
    if 0 in shape:
        return []
    boxes = [([0] * len(shape), list(shape))]
    for _ in range(draw(st.integers(0, 5))):
        splittable = [i for i, b in enumerate(boxes) if any(n >= 2 for n in b[1])]
        if not splittable:
            break
        i = draw(st.sampled_from(splittable))
        offs, lens = boxes.pop(i)
        d = draw(st.sampled_from([d for d, n in enumerate(lens) if n >= 2]))
        cut = draw(st.integers(1, lens[d] - 1))
        a_l, b_l, b_o = list(lens), list(lens), list(offs)
        a_l[d], b_l[d], b_o[d] = cut, lens[d] - cut, offs[d] + cut
        boxes += [(list(offs), a_l), (b_o, b_l)]
    return boxes


def _json_values() -> Any:
    leaf = (st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
    return st.recursive(leaf, lambda c: st.lists(c, max_size=3)
                        | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=6)


#: key and name of what :func:`exercising` adds; longer than any generated key or entry name
EXERCISE_NAME = "conformance.codec"
#: key of the tensor :func:`exercising` adds so that a data file spans several checksum blocks
#: (every other tensor a case draws is smaller than one 4 KiB block)
EXERCISE_BLOCKS = "conformance.blocks"
#: key of the zero-size tensor :func:`exercising` adds (a writer that left zero-size tensors
#: undeclared passed runs whose draws had none: conformance review C10)
EXERCISE_EMPTY = "conformance.empty"


def exercising(case: SaveCase) -> SaveCase:
    """``case`` made to exercise its codec and multi-block checksums.

    A stratum's case must reach the writer's code for its codec even where hypothesis draws its
    simplest state (no tensors, no entries): ranges of ``case.codec``, and an entry encoded
    ``json+zstd`` for ``zstd`` (``json`` for ``none``). It holds a tensor of every dtype (a
    writer that mislabels one dtype failed only when a random draw happened to use it), and a
    10,400-byte tensor whose first 8,000 bytes one writer stores, so its data file spans three
    4 KiB checksum blocks with a partial last one (the checksum of block 1 onward, and the
    block size itself, were never tested: every drawn tensor fits one block), and a zero-size
    tensor (declared with no range).
    """
    if not any(t.boxes for t in case.tensors):
        case.tensors.append(TensorSpec(EXERCISE_NAME, "float32", [16, 4], case.step,
                                       [([0, 0], [9, 4], 0),
                                        ([9, 0], [7, 4], case.num_writers - 1)]))
    if not any(t.key == EXERCISE_BLOCKS for t in case.tensors):
        case.tensors.append(TensorSpec(EXERCISE_BLOCKS, "float32", [2600], case.step + 1,
                                       [([0], [2000], 0),
                                        ([2000], [600], case.num_writers - 1)]))
    if not any(0 in t.shape for t in case.tensors):  # declared, no range (spec §8.1)
        case.tensors.append(TensorSpec(EXERCISE_EMPTY, "float32", [0, 3], case.step, []))
    have = {t.dtype for t in case.tensors if t.boxes}
    for i, dtype in enumerate(d for d in DTYPES if d not in have):  # every dtype, every run
        case.tensors.append(TensorSpec(f"{EXERCISE_NAME}.{dtype}", dtype, [3], case.step + 2 + i,
                                       [([0], [3], i % case.num_writers)]))
    encoding = "json+zstd" if case.codec == "zstd" else "json"
    if not any(e.encoding == encoding for e in case.entries):
        case.entries.append(EntrySpec(EXERCISE_NAME, {"id": "pck:json/1"}, "global", encoding,
                                      value={"codec": case.codec}, writer=0))
    return case


def _world_size(draw: Any, nw: int, kind: str | None) -> int:
    """The saving job's world size for ``nw`` writers (:data:`RANK_KINDS`; drawn if None)."""
    kinds = [k for k in RANK_KINDS if k != "fewer" or nw >= 2]
    if kind is None:
        kind = draw(st.sampled_from(kinds))
    elif kind not in kinds:  # fewer ranks than one writer: one rank per writer
        kind = "writers"
    if kind == "fewer":
        return int(draw(st.integers(1, nw - 1)))
    if kind == "more":
        return int(draw(st.integers(nw + 1, nw + 4)))
    return nw


def save_cases(max_writers: int = 4, codecs: tuple[str, ...] = ("none", "zstd"),
               max_tensors: int = 4, max_entries: int = 3, min_step: int = 0,
               tables: str = "sometimes", exercise: bool = False,
               continuation_kind: tuple[str, bool] | None = None,
               rank_kind: str | None = None) -> Any:
    """Hypothesis strategy of :class:`SaveCase`: uneven 0–4-D shardings of every dtype.

    ``tables`` (one of :data:`TABLE_MODES`) says whether cases ask for a tensor table;
    ``exercise`` gives every case two writers at least (where ``max_writers`` allows: concurrent
    writers even in hypothesis' simplest state) and passes it through :func:`exercising`.
    The commit job's continuation (§13) is drawn — contract ``exact`` or ``statistical``, mesh
    ``null`` or one of the world size — unless ``continuation_kind`` fixes the contract and
    whether there is a mesh (:data:`CONTINUATIONS`). The world size is drawn from
    :data:`RANK_KINDS` (as many ranks as writers, fewer or more) unless ``rank_kind`` fixes it;
    a case with more ranks than writers has no per-rank entry.
    """
    if tables not in TABLE_MODES:
        raise ValueError(f"tables must be one of {TABLE_MODES}, got {tables!r}")
    if rank_kind is not None and rank_kind not in RANK_KINDS:
        raise ValueError(f"rank_kind must be one of {RANK_KINDS}, got {rank_kind!r}")

    @st.composite
    def build(draw: Any) -> SaveCase:
        nw = draw(st.integers(min(2, max_writers) if exercise else 1, max_writers))
        ws = _world_size(draw, nw, rank_kind)
        codec = draw(st.sampled_from(list(codecs)))
        keys = draw(st.lists(st.text(st.characters(exclude_categories=["Cs"], exclude_characters=_CONTROL),
                                     min_size=1, max_size=12),
                             max_size=max_tensors, unique=True))
        tensors = []
        for key in keys:
            dtype = draw(st.sampled_from(list(DTYPES)))
            ndim = draw(st.integers(0, 4))
            shape = draw(st.lists(st.integers(0 if draw(st.booleans()) and ndim else 1,
                                              max(1, 6 - ndim)),
                                  min_size=ndim, max_size=ndim))
            replicated = draw(st.booleans())  # every writer holds it, exactly one writes it
            parts = [([0] * ndim, list(shape))] if replicated and 0 not in shape else \
                _partition(draw, shape)
            boxes = [(o, n, draw(st.integers(0, nw - 1))) for o, n in parts]
            tensors.append(TensorSpec(key, dtype, shape, draw(st.integers(0, 2**32 - 1)),
                                      boxes, draw(st.integers(0, nw - 1))))
        names = draw(st.lists(st.from_regex(r"[a-z][a-z0-9_.-]{0,8}(/[a-z][a-z0-9_-]{0,4})?",
                                            fullmatch=True)
                              # §12.1: 248 fits ".g.json" only; per-rank ".r00000.json.zst" names
                              # break §2.2 above 239 characters (writers must fall back)
                              | st.sampled_from(["n" * 256, "a/b/c/d/e/f/g/h", "x." * 100, "b" * 240,
                                                 "c" * 248]),
                              max_size=max_entries, unique=True))
        entries = []
        for name in names:
            schema = draw(st.sampled_from([{"id": "pck:json/1"}, {"json_schema": {}},
                                           {"json_schema": {"not": {"type": "null"}}}]))
            vals = _json_values().filter(lambda v: v is not None) \
                if "not" in schema.get("json_schema", {}) else _json_values()
            enc = draw(st.sampled_from(["json", "json+zstd"]))
            if ws > nw or draw(st.booleans()):  # more ranks than writers: global only
                entries.append(EntrySpec(name, schema, "global", enc, value=draw(vals),
                                         writer=draw(st.integers(0, nw - 1))))
            else:
                entries.append(EntrySpec(
                    name, schema, "per_rank", enc, values=[draw(vals) for _ in range(ws)],
                    policy=draw(st.sampled_from(["require_same", "modulo", "rank0", "drop"]))))
        step = draw(st.integers(min_step, min_step + 10**6))
        want_table = tables == "always" or (tables == "sometimes" and draw(st.booleans()))
        table_codec = draw(st.sampled_from(["none", "zstd"])) if want_table else "none"
        contract, meshed = continuation_kind if continuation_kind is not None else (
            draw(st.sampled_from(["exact", "statistical"])), draw(st.booleans()))
        mesh = continuation(ws, draw(st.integers(1, ws))) if meshed else None
        case = SaveCase(step, nw, codec, tensors, entries, want_table, table_codec,
                        contract, mesh, None if ws == nw else ws)
        return exercising(case) if exercise else case

    return build()


def crash_cases(max_writers: int = 3, codecs: tuple[str, ...] = ("none", "zstd"),
                tables: str = "sometimes", fault: str | None = None) -> Any:
    """Hypothesis strategy of :class:`CrashCase`; ``fault`` fixes the fault point."""
    if fault is not None and fault not in FAULT_POINTS:
        raise ValueError(f"fault must be one of {FAULT_POINTS}, got {fault!r}")

    @st.composite
    def build(draw: Any) -> CrashCase:
        a = draw(save_cases(max_writers, codecs, max_tensors=2, max_entries=1, tables=tables))
        b = draw(save_cases(max_writers, codecs, max_tensors=2, max_entries=1,
                            min_step=a.step + 1, tables=tables))
        if not any(t.boxes for t in b.tensors):  # give the writers something to write
            b.tensors.append(TensorSpec("crash.filler", "float32", [64, 8], 1,
                                        [([0, 0], [64, 8], 0)]))
        point = fault if fault is not None else draw(st.sampled_from(FAULT_POINTS))
        # i -> 0.5 + 0.618·i mod 1 spreads the kill points even where hypothesis favours small
        # i; its first example, i = 0, kills half-way (mid-file), not after the first call.
        at = draw(st.integers(0, 999).map(lambda i: (500 + i * 618) % 1000 / 1000))
        return CrashCase(a, b, point, draw(st.integers(0, b.num_writers - 1)), at)

    return build()


# ---------------------------------------------------------------------------------- JSON form
def case_to_json(case: SaveCase | CrashCase) -> dict[str, Any]:
    """A JSON-able description of ``case`` (``case.json`` of a case directory)."""
    kind = "crash" if isinstance(case, CrashCase) else "save"
    return {"kind": kind, **asdict(case)}


def _save_from(d: dict[str, Any]) -> SaveCase:
    tensors = [TensorSpec(t["key"], t["dtype"], list(t["shape"]), t["seed"],
                          [(list(o), list(n), w) for o, n, w in t["boxes"]], t["declared_by"])
               for t in d["tensors"]]
    entries = [EntrySpec(**e) for e in d["entries"]]
    return SaveCase(d["step"], d["num_writers"], d["codec"], tensors, entries,
                    d.get("tensor_table", False), d.get("table_codec", "none"),
                    d.get("contract", "exact"), d.get("mesh"), d.get("world_size"))


def case_from_json(d: dict[str, Any]) -> SaveCase | CrashCase:
    """Inverse of :func:`case_to_json`."""
    if d.get("kind") == "crash":
        return CrashCase(_save_from(d["first"]), _save_from(d["second"]), d["fault"],
                         d["victim"], d.get("at", 0.5))
    return _save_from(d)
