"""Restore drills: prove a committed version restores on a given world size, and measure it.

A drill starts a fresh local gloo group of ``world_size`` processes. Each rank builds freshly
allocated target state — from the checkpoint's metadata (every tensor with at least one dimension
becomes a DTensor sharded ``Shard(0)`` over a 1-D mesh; 0-d tensors stay plain; ``pck:rng/1`` and
``pck:data-position/1`` entries get their helpers) or from a user factory — loads the version
into it (``allow_statistical=True``), and runs one step. The record (restore bandwidth, slowest
rank, peak temporary memory per rank, time to the first post-restore step, or the error) is
stored as ``drills/<drill-id>.json`` beside the manifest; ``manifest.json`` is never edited.

A factory is ``"module:function"``; it is called as ``function(rank, world_size, checkpoint)``
(``checkpoint`` is the opened :class:`portable_ckpt.io.reader.Checkpoint`) inside the
initialised process group and returns either a state dict or ``(state_dict, step_fn)`` where
``step_fn()`` runs one training step.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from portable_ckpt.errors import CheckpointError
from portable_ckpt.logs import Progress
from portable_ckpt.torch._proc import reset_peak_rss, rss

if TYPE_CHECKING:
    from portable_ckpt.torch.launch import GroupResult

__all__ = ["build_state_from_metadata", "drill"]

_log = logging.getLogger(__name__)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build_state_from_metadata(ck: Any, rank: int, world_size: int) -> dict[str, Any]:
    """Allocate empty target state for every tensor and continuation entry of ``ck``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import portable_ckpt.torch as pckt
    from portable_ckpt.torch._tensors import torch_dtype
    from portable_ckpt.torch.flatten import split_key
    from portable_ckpt.torch.layout import chunk_extent

    mesh = (
        init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp",))
        if dist.is_initialized()
        else None
    )
    flat: dict[str, Any] = {}
    for key, t in ck.tensors.items():
        dtype = torch_dtype(t.dtype)
        shape = tuple(t.shape)
        if mesh is None or not shape or shape[0] == 0:
            flat[key] = torch.empty(shape, dtype=dtype)
            continue
        _, n = chunk_extent(shape[0], world_size, rank)
        local = torch.empty((n, *shape[1:]), dtype=dtype)
        stride = torch.empty(shape, dtype=dtype, device="meta").stride()
        flat[key] = DTensor.from_local(
            local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape), stride=stride
        )
    for name, e in ck.entries.items():
        sid = e.schema.get("id")
        if sid == "pck:rng/1" and e.scope == "per_rank":
            flat[name] = pckt.RNGState(e.world_size_policy or "modulo")
        elif sid == "pck:data-position/1" and e.scope == "per_rank":
            flat[name] = pckt.DataPosition(world_size_policy=e.world_size_policy or "rank0")
    # Nest by the key rule so that flattening gives the stored keys back.
    root: dict[str, Any] = {}
    for key, value in flat.items():
        parts = split_key(key)
        node = root
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return root


def _default_step(state: dict[str, Any]) -> None:
    """One synthetic step over every restored float tensor: a global norm and an update."""
    import torch
    import torch.distributed as dist

    from portable_ckpt.torch.flatten import flatten_state

    tensors = [t for t in flatten_state(state).tensors.values() if t.is_floating_point()]
    locals_ = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    sq = torch.zeros(1, dtype=torch.float64)
    for t in locals_:
        if t.numel():
            sq += t.detach().double().pow(2).sum()
    if dist.is_initialized():
        dist.all_reduce(sq)
    if not torch.isfinite(sq).all():
        raise FloatingPointError("restored state holds non-finite values")
    with torch.no_grad():
        for t in locals_:
            if t.numel():
                t.mul_(1.0 - 1e-6)


def _drill_rank(
    rank: int, world: int, root: str, attempt_id: str, factory: str | None
) -> dict[str, Any]:
    from portable_ckpt.errors import CheckpointError
    from portable_ckpt.io.reader import Checkpoint
    from portable_ckpt.io.versions import load_manifest
    from portable_ckpt.storage import open_storage

    out: dict[str, Any] = {"rank": rank, "ok": False, "error": None}
    try:
        storage = open_storage(root)
        ck = Checkpoint(storage, attempt_id, load_manifest(storage, attempt_id))
        state, step_fn = _target_state(ck, rank, world, factory)
        out.update(ok=True, **_restore_and_step(state, step_fn, root, attempt_id))
    except CheckpointError as e:
        out["error"] = e.to_json()
    except Exception as e:
        out["error"] = {"code": "PCK-DISTRIBUTED", "message": f"{type(e).__name__}: {e}"}
    return out


def _target_state(
    ck: Any, rank: int, world: int, factory: str | None
) -> tuple[dict[str, Any], Callable[[], Any] | None]:
    """The fresh target state (and step function) from the factory, or from the metadata."""
    if not factory:
        return build_state_from_metadata(ck, rank, world), None
    import importlib

    module, _, name = factory.partition(":")
    made = getattr(importlib.import_module(module), name)(rank, world, ck)
    return made if isinstance(made, tuple) else (made, None)


def _restore_and_step(
    state: dict[str, Any], step_fn: Callable[[], Any] | None, root: str, attempt_id: str
) -> dict[str, Any]:
    """Load into ``state`` and run one step; return this rank's measurements."""
    import torch.distributed as dist

    import portable_ckpt.torch as pckt

    dist.barrier()
    reset_peak_rss()
    t0 = time.perf_counter()
    info = pckt.load(state, root, checkpoint_id=attempt_id, allow_statistical=True)
    t1 = time.perf_counter()
    cur, peak = rss()
    if step_fn is not None:
        step_fn()
    else:
        _default_step(state)
    t2 = time.perf_counter()
    return {
        "restore_seconds": t1 - t0,
        "first_step_seconds": t2 - t1,
        "total_seconds": t2 - t0,
        "bytes_read": info.bytes_read,
        "target_bytes": info.target_bytes,
        "peak_temp_bytes": info.peak_temp_bytes,
        "rss_growth_bytes": max(0, peak - cur),
        "contract": info.contract,
        "saved_world_size": info.saved_world_size,
    }


def drill(
    checkpoint: str,
    world_size: int,
    *,
    step: int | None = None,
    factory: str | None = None,
    record: bool = True,
    timeout: float = 600.0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run a restore drill of a committed version on ``world_size`` fresh processes.

    Args:
        checkpoint: A checkpoint root or a version directory. A root's version is the one a
            restore takes (the newest that no verification failed), or with ``step``, the
            newest of that step (failed or not: an explicit choice).
        world_size: Ranks of the drill group.
        step: With a root, drill the newest version of this step.
        factory: ``"module:function"`` building the target state (see the module docstring).
        record: Store the record as ``drills/<drill-id>.json`` beside the manifest.
        timeout: Seconds before the drill group is killed.
        progress: Called as ``progress(ranks_finished, world_size)`` as the ranks exit.

    Returns:
        The drill record (with ``drill_id`` and ``path`` when stored; ``record_error``, the
        code, message and ``retryable`` of why it was not, where storing it failed) plus
        ``per_rank`` details,
        and ``verification``: the path of the failed verification recorded for damage the
        drill met (when stored and a second read confirmed it).

    """
    import portable_ckpt
    from portable_ckpt.errors import VersionDeletedError
    from portable_ckpt.format.naming import ATTEMPT_ID_RE
    from portable_ckpt.io.annotations import version_gone, write_drill_record
    from portable_ckpt.torch.launch import run_group

    # A root's version may be deleted while it is drilled (a running job's retention): that is
    # no failed restore, and a weekly drill paged for it (manager review 25, M2). The root is
    # resolved again once and its version then a restore takes is drilled.
    again = step is None and not ATTEMPT_ID_RE.match(
        os.fspath(checkpoint).rstrip("/").rsplit("/", 1)[-1])
    while True:
        ck = portable_ckpt.open(_restorable(checkpoint) if step is None else checkpoint,
                                step=step)
        root = ck.storage.url
        started = _now()
        res = run_group(
            _drill_rank,
            world_size,
            (root, ck.id, factory),
            timeout=timeout,
            pg_timeout=min(timeout, 300.0),
            progress=progress,
        )
        rec = _record(ck, res, world_size, started, _now())
        if rec["ok"] or not version_gone(ck.storage, ck.id):
            break
        if not again:
            raise VersionDeletedError(
                f"{root.rstrip('/')}/{ck.id} was deleted while it was drilled (retention, a "
                "gc): no drill record; drill it again, or pin the version for the drill "
                "(`portable-ckpt pin`)", path=f"{ck.id}/manifest.json")
        again = False
    out: dict[str, Any] = dict(rec)
    if record:
        try:
            rel = write_drill_record(ck.storage, ck.id, rec)
        except CheckpointError as exc:
            # The drill ran: its result stands, said with why it is not stored (a full or
            # read-only root showed the record's error alone: fault review 27, F4).
            out["record_error"] = {"code": exc.code, "message": exc.message,
                                   "retryable": exc.retryable}
        else:
            out["path"] = f"{root.rstrip('/')}/{rel}"
            out["drill_id"] = rel.rsplit("/", 1)[-1].removesuffix(".json")
        verification = _record_damage(ck, _rank_results(res))
        if verification is not None:
            out["verification"] = f"{root.rstrip('/')}/{verification}"
    out["attempt_id"] = ck.id
    out["step"] = ck.step
    out["per_rank"] = _rank_results(res)
    out["seconds_total"] = res.seconds
    return out


def _restorable(checkpoint: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """A root's version a restore takes (the newest that no verification failed, R-DRILL-8).

    A drill answers "will the restart work?": ``drill ROOT`` drilled the newest version even
    when a verification had failed it, so it failed again and again on a version no restore
    takes (incident review 2, F6). A version's path is kept as given.
    """
    from portable_ckpt.errors import NotFoundError, StorageError
    from portable_ckpt.format.naming import ATTEMPT_ID_RE
    from portable_ckpt.io.versions import newest_first, restore_decision, root_must_exist
    from portable_ckpt.storage import open_storage

    text = os.fspath(checkpoint)
    if ATTEMPT_ID_RE.match(text.rstrip("/").rsplit("/", 1)[-1]):
        return checkpoint
    storage = open_storage(text)
    root_must_exist(storage)  # a mistyped root is not "no version a restore takes"
    for v in newest_first(storage):
        decision = restore_decision(v)
        if decision == "stop":
            raise StorageError(
                f"cannot tell which version a restore takes: {v.id} could not be read "
                f"({v.error or '?'})", path=v.id, retryable=v.error_retryable)
        if decision == "take":
            return v.path
    raise NotFoundError(f"{text}: no committed version that no verification failed (a drill "
                        "of a failed one: pass its directory)")


def _record_damage(ck: Any, ranks: list[dict[str, Any]]) -> str | None:
    """A drill that met damage records it as a failed verification; return the record's path.

    A failed drill does not count against a version (R-DRILL-4): after a drill found a
    checksum error, ``ls --latest`` still named the damaged version and gc kept it as the
    newest good one (incident review R5). Damage a second read of its file finds again is
    recorded as a restore records it (:func:`~portable_ckpt.io.damage.record_read_damage`;
    R-DRILL-8: never restored automatically again); anything else (a crash, a timeout, a
    storage error, a node root's file another node holds) is not.
    """
    from portable_ckpt.io.damage import record_read_damage

    found = [(str(e.get("code")), str(e.get("message", "")), None)
             for e in (r.get("error") for r in ranks) if e]
    try:
        verdict, path, notes = record_read_damage(ck.storage, ck.id, ck.manifest, found,
                                                  verifier="portable-ckpt drill")
    except CheckpointError as exc:  # the drill's own record is written all the same
        _log.error("the drill met damage in %s but could not record it: %s", ck.id, exc)
        return None
    for x in notes:
        (_log.error if verdict == "unrecorded" else _log.warning)(
            "drill of %s: %s", ck.id, x.message[:600])
    return path


def _rank_results(res: GroupResult) -> list[dict[str, Any]]:
    return [r if isinstance(r, dict) else {"ok": False, "error": None} for r in res.results]


def _record(
    ck: Any, res: GroupResult, world_size: int, started: str, finished: str
) -> dict[str, Any]:
    """The drill record (spec §14.3) from every rank's result."""
    ranks = _rank_results(res)
    ok = res.ok and all(r.get("ok") for r in ranks)
    if ok:
        contract = str(ranks[0]["contract"])
    elif ck.continuation.world_size != world_size or ck.continuation.contract != "exact":
        contract = "statistical"
    else:
        contract = "exact"
    return {
        "ok": ok,
        "started_at": started,
        "finished_at": finished,
        "world_size": world_size,
        "saved_world_size": ck.continuation.world_size,
        "contract": contract,
        "measurements": _measurements(ranks) if ok else {},
        "error": None if ok else _group_error(res, ranks),
    }


def _group_error(res: GroupResult, ranks: list[dict[str, Any]]) -> dict[str, str]:
    """The first rank's error, or which ranks exited abnormally."""
    errors: list[dict[str, Any]] = [r["error"] for r in ranks if r.get("error")]
    if errors:
        return {"code": str(errors[0]["code"]), "message": str(errors[0]["message"])[:65536]}
    detail = "; ".join(f"rank {i}: exit {c}" for i, c in enumerate(res.exitcodes) if c != 0)
    return {"code": "PCK-DISTRIBUTED", "message": f"drill group failed: {detail or 'no result'}"}


def _measurements(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    restore = max(r["restore_seconds"] for r in ranks)
    nbytes = sum(int(r["bytes_read"]) for r in ranks)
    return {
        "restore_seconds": restore,
        "restore_bytes": nbytes,
        "restore_mib_per_s": nbytes / 2**20 / restore if restore > 0 else 0.0,
        "slowest_rank_seconds": max(r["total_seconds"] for r in ranks),
        "peak_temp_bytes_per_rank": [int(r["peak_temp_bytes"]) for r in ranks],
        "first_step_seconds": max(r["first_step_seconds"] for r in ranks),
        "rss_growth_bytes_per_rank": [int(r["rss_growth_bytes"]) for r in ranks],
        "target_bytes_per_rank": [int(r["target_bytes"]) for r in ranks],
    }
