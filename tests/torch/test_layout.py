"""Box arithmetic of DTensor layouts (``Shard``, ``_StridedShard``, ``Replicate``) against DTensor.

DTensor's own sharding runs in one process on torch's fake process group: a mesh whose rank 0
sits at the coordinate under test makes ``distribute_tensor(..., src_data_rank=None)`` compute
that coordinate's local tensor with DTensor's split code (no communication), which is then
compared element by element with the boxes of :func:`local_pieces`.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from portable_ckpt.errors import UnsupportedValueError  # noqa: E402
from portable_ckpt.ranges import Box, check_coverage  # noqa: E402
from portable_ckpt.torch.layout import (  # noqa: E402
    PlacementSpec,
    local_pieces,
    shard_box,
    writes_region,
)

pytestmark = pytest.mark.torch


@contextlib.contextmanager
def fake_group(world: int) -> Iterator[None]:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def torch_placement(p: PlacementSpec) -> Any:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if p.kind == "shard":
        return Shard(p.dim)
    if p.kind == "strided":
        return _StridedShard(p.dim, split_factor=p.split_factor)
    return Replicate()


def mesh_at(mesh_shape: tuple[int, ...], coord: tuple[int, ...]) -> Any:
    """A mesh of ``prod(mesh_shape)`` ranks in which this process (rank 0) sits at ``coord``."""
    from torch.distributed.device_mesh import DeviceMesh

    ranks = list(range(math.prod(mesh_shape)))
    here = sum(c * math.prod(mesh_shape[i + 1 :]) for i, c in enumerate(coord))
    ranks[0], ranks[here] = ranks[here], ranks[0]
    return DeviceMesh("cpu", torch.tensor(ranks).reshape(mesh_shape), _init_backend=False)


def layouts(strided: bool) -> st.SearchStrategy[Any]:
    def placements(ndim: int) -> st.SearchStrategy[PlacementSpec]:
        kinds = [st.just(PlacementSpec("replicate"))]
        if ndim:
            kinds.append(st.builds(lambda d: PlacementSpec("shard", d), st.integers(0, ndim - 1)))
            if strided:
                kinds.append(
                    st.builds(
                        lambda d, f: PlacementSpec("strided", d, f),
                        st.integers(0, ndim - 1),
                        st.integers(1, 4),
                    )
                )
        return st.one_of(*kinds)

    return st.tuples(
        st.lists(st.integers(0, 11), min_size=0, max_size=3),
        st.lists(st.integers(1, 4), min_size=1, max_size=3).filter(lambda m: math.prod(m) <= 16),
    ).flatmap(
        lambda gm: st.tuples(
            st.just(tuple(gm[0])),
            st.just(tuple(gm[1])),
            st.lists(placements(len(gm[0])), min_size=len(gm[1]), max_size=len(gm[1])),
        )
    )


@given(layouts(strided=True))
def test_pieces_match_dtensor_local_tensors(layout: Any) -> None:
    """Every coordinate's boxes hold exactly DTensor's local tensor; writers cover the tensor once."""
    from torch.distributed.tensor import distribute_tensor

    shape, mesh_shape, specs = layout
    full = torch.arange(math.prod(shape), dtype=torch.int64).reshape(shape)
    writers: list[Box] = []
    with fake_group(math.prod(mesh_shape)):
        for coord in itertools.product(*[range(n) for n in mesh_shape]):
            dt = distribute_tensor(
                full,
                mesh_at(mesh_shape, coord),
                [torch_placement(p) for p in specs],
                src_data_rank=None,
            )
            local = dt.to_local()
            local_shape, pieces = local_pieces(shape, mesh_shape, coord, specs)
            assert local_shape == tuple(local.shape)
            assert sum(math.prod(p.lengths) for p in pieces) == local.numel()
            for p in pieces:
                glob = tuple(slice(o, o + n) for o, n in zip(p.offsets, p.lengths, strict=True))
                assert torch.equal(local[p.local_slices()], full[glob]), (coord, p)
            if pieces:  # the boxes tile the local tensor
                check_coverage(
                    local_shape, [Box(p.local_offsets, p.lengths) for p in pieces], key="l"
                )
            if writes_region(coord, specs):
                writers.extend(Box(p.offsets, p.lengths) for p in pieces)
    if math.prod(shape):
        check_coverage(shape, writers, key="t")  # raises on a gap or an overlap
    else:
        assert writers == []


def test_fsdp_tp_uneven_rows_are_one_box_each() -> None:
    """FSDP2 on TP (10 rows, dp=2 x tp=2): [_StridedShard(0, sf=2), Shard(0)] -> rows 0-2, 5-7, 3-4, 8-9."""
    specs = [PlacementSpec("strided", 0, 2), PlacementSpec("shard", 0)]
    got = {
        c: local_pieces((10, 6), (2, 2), c, specs)[1] for c in itertools.product(range(2), range(2))
    }
    rows = {c: [(p.offsets[0], p.lengths[0]) for p in ps] for c, ps in got.items()}
    assert rows == {(0, 0): [(0, 3)], (0, 1): [(5, 3)], (1, 0): [(3, 2)], (1, 1): [(8, 2)]}
    assert shard_box((10, 6), (2, 2), (0, 1), specs) == ((5, 0), (3, 6))


def test_strided_alone_gives_several_boxes() -> None:
    """_StridedShard(0, sf=2) on 2 ranks over 9 rows: rank 0 holds rows 0-2 and 5-6."""
    shape, pieces = local_pieces((9,), (2,), (0,), [PlacementSpec("strided", 0, 2)])
    assert shape == (5,)
    assert [(p.offsets, p.lengths, p.local_offsets) for p in pieces] == [
        ((0,), (3,), (0,)),
        ((5,), (2,), (3,)),
    ]
    with pytest.raises(UnsupportedValueError):
        shard_box((9,), (2,), (0,), [PlacementSpec("strided", 0, 2)])


def test_a_local_shard_of_another_shape_than_the_placement_gives_is_refused() -> None:
    """mutation audit 22 B2-22: a DTensor built with ``from_local`` whose local shard is not the
    one its placements give (uneven sharding done by hand: 3 rows where Shard(0) of 8 rows on
    2 ranks gives 4) is refused; it was written into the box of the expected shape."""
    from torch.distributed.tensor import DTensor, Shard

    from portable_ckpt.torch.layout import dtensor_layout

    with fake_group(2):
        mesh = mesh_at((2,), (0,))
        dt = DTensor.from_local(torch.arange(3.0), mesh, [Shard(0)], run_check=False,
                                shape=torch.Size([8]), stride=(1,))
        with pytest.raises(UnsupportedValueError, match=r"local shard shape \[3\] differs"):
            dtensor_layout(dt, key="w")
        even = DTensor.from_local(torch.arange(4.0), mesh, [Shard(0)], run_check=False,
                                  shape=torch.Size([8]), stride=(1,))
        assert dtensor_layout(even, key="w") is not None


def test_the_job_mesh_is_the_larger_of_two_meshes_of_one_dimension() -> None:
    """mutation audit 22 B2-35: of two unrelated meshes with the same number of dimensions
    (a 2-rank mesh built for a few tensors, the job's 4-rank mesh), the larger stands for the
    job, whichever tensor comes first; the first one seen was taken."""
    from torch.distributed.tensor import DTensor, Shard

    from portable_ckpt.torch.layout import group_mesh

    with fake_group(4):
        small, big = mesh_at((2,), (0,)), mesh_at((4,), (0,))
        a = DTensor.from_local(torch.arange(2.0), small, [Shard(0)], run_check=False,
                               shape=torch.Size([4]), stride=(1,))
        b = DTensor.from_local(torch.arange(2.0), big, [Shard(0)], run_check=False,
                               shape=torch.Size([8]), stride=(1,))
        for order in ([a, b], [b, a]):
            mesh = group_mesh(order)
            assert mesh is not None and mesh.shape == (4,), mesh


def test_is_dtensor_remembers_classes_not_instances() -> None:
    """A class that defines the three attributes is remembered; one whose instances may or may
    not carry them (set per instance) is asked every time."""
    from portable_ckpt.torch.layout import _DTENSOR_CLASSES, is_dtensor

    class PerInstance:
        def __init__(self, full: bool) -> None:
            if full:
                self.device_mesh, self.placements, self.to_local = None, (), lambda: None

    class Declared:
        device_mesh = None
        placements = ()

        def to_local(self) -> None:
            return None

    assert is_dtensor(PerInstance(True))
    assert not is_dtensor(PerInstance(False))
    assert PerInstance not in _DTENSOR_CLASSES
    assert is_dtensor(Declared()) and Declared in _DTENSOR_CLASSES
    assert not is_dtensor(torch.ones(1)) and torch.Tensor not in _DTENSOR_CLASSES
