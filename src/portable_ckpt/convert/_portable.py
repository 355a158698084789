"""A portable version as a conversion source (portable → portable, e.g. to recompress).

Every range record becomes a chunk whose loader reads just that box (verified); every entry is
kept as it was: schema document, scope, per-rank values with their world-size policy, encoding.
"""

from __future__ import annotations

from typing import Any

from portable_ckpt.convert._model import (
    ChunkSpec,
    ConvertOptions,
    EntrySpec,
    SourcePlan,
    TensorSpec,
)

__all__ = ["read_portable_source"]


def _tensors(ck: Any) -> list[TensorSpec]:
    out: list[TensorSpec] = []
    for key in sorted(ck.tensors):
        info = ck.tensors[key]
        item = info.numpy_dtype.itemsize
        chunks = []
        for r in info.ranges:
            offs, lens = tuple(r.offsets), tuple(r.lengths)
            nbytes = item
            for n in lens:
                nbytes *= n

            def load(
                key: str = key, offs: tuple[int, ...] = offs, lens: tuple[int, ...] = lens
            ) -> Any:
                return ck.read(key, offs, lens)

            chunks.append(ChunkSpec(offs, lens, nbytes, f"{ck.path}/{r.file}", load))
        out.append(TensorSpec(key, info.dtype, tuple(info.shape), chunks))
    return out


def _entries(ck: Any) -> list[EntrySpec]:
    out: list[EntrySpec] = []
    world = ck.continuation.world_size
    for name in sorted(ck.entries):
        e = ck.entries[name]
        compress = e.encoding == "json+zstd"
        if e.scope == "global":
            out.append(EntrySpec(name, ck.entry(name), dict(e.schema), compress=compress))
            continue
        for v in sorted(e.values, key=lambda v: v.rank):
            out.append(
                EntrySpec(
                    name,
                    ck.entry(name, rank=v.rank, world_size=world),
                    dict(e.schema),
                    scope="per_rank",
                    rank=v.rank,
                    world_size_policy=e.world_size_policy,
                    compress=compress,
                )
            )
    return out


def read_portable_source(src: str, options: ConvertOptions) -> SourcePlan:
    """Describe the portable version at ``src`` (a root: ``options.step`` or its latest)."""
    import portable_ckpt

    ck = portable_ckpt.open(src, step=options.step)
    plan = SourcePlan(
        "portable", _tensors(ck), _entries(ck), world_size=ck.continuation.world_size
    )
    plan.step, plan.step_source = ck.step, f"the source version {ck.id}"
    plan.continuation = ck.continuation  # contract and world size stay the source's
    return plan
