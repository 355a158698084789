"""A save never reports success for a commit record that readers refuse (R-COMMIT-4).

Before: an entry name with a space, or a mesh with two dimensions of one name, was written and
committed; every reader then refused the record, a load silently restored the previous step,
and gc deleted the new attempt as abandoned.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import SchemaError, UsageError
from portable_ckpt.format.manifest import Continuation, Mesh
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage

BAD_ENTRY_NAMES = ["learning rate", "é", "x/", "a//b", ".", "../x", "/x", "x\n", "a/./b", ""]

BAD_CONTINUATIONS = [
    Continuation("weird", 1),
    Continuation("exact", 0),
    Continuation("exact", 10**9),
    Continuation("exact", 4, Mesh((2, 2), ("dp", "dp"))),
    Continuation("exact", 4, Mesh((2, 2), ("dp", ""))),
    Continuation("exact", 4, Mesh((2, 3), ("dp", "tp"))),
]


def _first(root: Path) -> None:
    portable_ckpt.save_arrays(root, {"w": np.zeros(4)}, step=100, entries={"lr": 0.1})


@pytest.mark.parametrize("name", BAD_ENTRY_NAMES)
def test_bad_entry_name_is_refused_before_anything_is_written(tmp_path: Path, name: str) -> None:
    _first(tmp_path)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(UsageError, match="entry names are 1-256 characters"):
        portable_ckpt.save_arrays(tmp_path, {"w": np.ones(4)}, step=200, entries={name: 0.05})
    assert sorted(os.listdir(tmp_path)) == before
    assert portable_ckpt.open(tmp_path).step == 100


@pytest.mark.parametrize("cont", BAD_CONTINUATIONS, ids=lambda c: repr(c))
def test_bad_continuation_is_refused_before_anything_is_written(
    tmp_path: Path, cont: Continuation
) -> None:
    _first(tmp_path)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(UsageError, match="continuation"):
        portable_ckpt.save_arrays(tmp_path, {"w": np.ones(4)}, step=200, continuation=cont)
    assert sorted(os.listdir(tmp_path)) == before


def test_valid_names_and_mesh_still_commit(tmp_path: Path) -> None:
    cont = Continuation("statistical", 4, Mesh((2, 2), ("dp", "tp")))
    portable_ckpt.save_arrays(
        tmp_path, {"w": np.ones(4)}, step=7, entries={"opt/lr.v1": 0.1}, continuation=cont
    )
    ck = portable_ckpt.open(tmp_path)
    assert ck.step == 7 and ck.entry("opt/lr.v1") == 0.1
    assert [v.status for v in portable_ckpt.list_versions(tmp_path)] == ["committed"]


def test_commit_of_an_in_memory_index_readers_refuse_publishes_nothing(tmp_path: Path) -> None:
    """An index built by other code (not ShardWriter's checks): the record is parsed first."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(3)
    w = ShardWriter(storage, attempt, 0, write_index=False)
    w.add_tensor("w", np.arange(4.0))
    w.add_entry("lr", 0.1)
    idx = w.finish()
    entry = idx.entries.pop("lr")
    idx.entries["learning rate"] = dataclasses.replace(entry, name="learning rate")
    with pytest.raises(SchemaError, match="readers would refuse this commit record") as err:
        commit(storage, attempt, step=3, indexes=[idx], expected_writers=[0])
    assert "entries['learning rate']" in err.value.message
    assert not (tmp_path / attempt / "manifest.json").exists()
    assert [v.status for v in portable_ckpt.list_versions(tmp_path)] == ["incomplete"]


def _nested(depth: int) -> list[object]:
    top: list[object] = []
    node = top
    for _ in range(depth - 1):
        child: list[object] = []
        node.append(child)
        node = child
    return top


@pytest.mark.parametrize(
    ("value", "why"),
    [(_nested(65), "nesting deeper than 64"), (10**400, "overflows a double")],
)
def test_entry_values_readers_refuse_are_refused_at_save(
    tmp_path: Path, value: object, why: str
) -> None:
    """R-SEC-9, R-SEC-10: the writer parses each value as readers will, before writing it."""
    _first(tmp_path)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(UsageError, match=why):
        portable_ckpt.save_arrays(tmp_path, {"w": np.ones(4)}, step=200, entries={"e": value})
    assert sorted(os.listdir(tmp_path)) == before
    portable_ckpt.save_arrays(tmp_path, {"w": np.ones(4)}, step=300, entries={"e": _nested(64)})
    assert portable_ckpt.open(tmp_path).entry("e") == _nested(64)


def test_mesh_names_outside_the_pattern_are_refused_by_writers(tmp_path: Path) -> None:
    """R-CONTRACT-8: writers write identifier-like names; a DeviceMesh's own are mapped."""
    cont = Continuation("exact", 2, Mesh((2,), ("dp-shard",)))
    with pytest.raises(UsageError, match="mesh dimension names"):
        portable_ckpt.save_arrays(tmp_path, {"w": np.ones(2)}, step=1, continuation=cont)
    assert not any(tmp_path.iterdir())


def test_torch_mesh_names_are_recorded_as_labels_of_the_pattern() -> None:
    """R-CONTRACT-8: ``"dp-shard"`` of a DeviceMesh is written as ``"dp_shard"``."""
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from portable_ckpt.format.manifest import DIM_NAME_RE
    from portable_ckpt.torch.layout import dim_labels, mesh_description

    mesh = SimpleNamespace(mesh=np.zeros((2, 3)), mesh_dim_names=("dp-shard", "tp"))
    assert mesh_description(mesh) == ([2, 3], ["dp_shard", "tp"])
    odd = ["dp-shard", "dp_shard", "9x", "", "é", "a" * 70, "a" * 70]
    labels = dim_labels(odd)
    assert labels[:5] == ["dp_shard", "dp_shard_1", "_9x", "dim3", "_"]
    assert len(set(labels)) == len(labels) and all(DIM_NAME_RE.match(x) for x in labels)


def test_readers_accept_mesh_labels_older_writers_wrote(tmp_path: Path) -> None:
    """R-CONTRACT-8: a version an older writer recorded with ``"dp-shard"`` stays readable."""
    cont = Continuation("exact", 2, Mesh((2,), ("dp",)))
    m = portable_ckpt.save_arrays(tmp_path, {"w": np.ones(2)}, step=1, continuation=cont)
    path = tmp_path / m.attempt_id / "manifest.json"
    raw = path.read_bytes()
    assert b'"dim_names":["dp"]' in raw
    path.write_bytes(raw.replace(b'"dim_names":["dp"]', b'"dim_names":["dp-shard"]'))
    ck = portable_ckpt.open(tmp_path)
    assert ck.continuation.mesh is not None and ck.continuation.mesh.dim_names == ("dp-shard",)


def test_a_value_nested_past_the_recursion_limit_is_a_usage_error(tmp_path: Path) -> None:
    """Not a bare RecursionError from the public API (outside review, round 2)."""
    with pytest.raises(UsageError, match="nested deeper"):
        portable_ckpt.save_arrays(tmp_path, {"w": np.ones(2)}, step=1,
                                  entries={"e": _nested(5000)})
    assert not any(tmp_path.iterdir())
