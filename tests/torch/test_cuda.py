"""CUDA paths: pinned staging, device-to-host copies, loads into CUDA tensors, NCCL groups.

Marked ``cuda``; every test skips cleanly without a CUDA device (CI and the development machine
have none). ``bench/gpu_check.sh`` runs them on a GPU machine together with a staging-throughput
figure. What is checked:

* a save of CUDA tensors copies them into page-locked host buffers (``is_pinned``), for a sync
  save, a thread-mode and a process-mode async save (the shared segment registered with
  ``cudaHostRegister``), and what is written is the device value at the moment of the call,
  even when the caller's next kernels overwrite the tensors right away;
* a load fills CUDA targets in place (same storage, same device), with and without a dtype cast;
* on an NCCL default group (one rank per GPU, as many as there are, up to two) DTensors on a
  CUDA mesh save and load while training collectives run on NCCL; the metadata collectives stay
  on the gloo side group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import portable_ckpt.torch as pckt  # noqa: E402
from portable_ckpt.torch._shm import SHARED  # noqa: E402
from portable_ckpt.torch.staging import POOL  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]

ROOT = Path(__file__).resolve().parents[2]


def _device_state() -> dict[str, Any]:
    dev = torch.device("cuda", torch.cuda.current_device())
    base = torch.arange(4096, dtype=torch.float32, device=dev).reshape(64, 64)
    return {
        "f32": base.clone(),
        "bf16": (base / 7).to(torch.bfloat16),
        "i64": base.long(),
        "flags": base.long() % 3 == 0,
        "scalar": torch.tensor(1.25, device=dev),
        "cols": base.t(),  # not contiguous on the device
        "n": 5,
    }


def _cpu(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v
            for k, v in state.items()}


def _overwrite(state: dict[str, Any]) -> None:
    """Kernels queued right after the call returns: they must not reach the checkpoint."""
    with torch.no_grad():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                if v.dtype == torch.bool:
                    v.logical_not_()
                else:
                    v.add_(1000)


def _read_back(root: Path, expect: dict[str, Any]) -> None:
    """Load the newest version into CPU targets and compare with the values at the call."""
    target = {k: torch.zeros_like(v.contiguous()) if isinstance(v, torch.Tensor) else 0
              for k, v in expect.items()}
    pckt.load(target, str(root))
    for k, v in expect.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(target[k], v.contiguous()), k
        else:
            assert target[k] == v


def test_sync_save_stages_device_tensors_into_pinned_buffers(tmp_path: Path) -> None:
    state = _device_state()
    expect = _cpu(state)
    pckt.save(state, str(tmp_path), step=1)
    bufs = list(POOL._buffers.values())
    assert bufs and all(b.is_pinned() and b.device.type == "cpu" for b, _ in bufs)
    _read_back(tmp_path, expect)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_async_save_copies_the_device_values_of_the_call(tmp_path: Path, mode: str) -> None:
    state = _device_state()
    expect = _cpu(state)
    h = pckt.async_save(state, str(tmp_path), step=1, mode=mode)
    assert h.staged.done()
    _overwrite(state)  # queued on the current stream after the copies: never staged
    h.result(timeout=120)
    if mode == "process":
        assert SHARED.segment is not None and SHARED.segment.pinned
    else:
        assert all(b.is_pinned() for b, _ in POOL._buffers.values())
    _read_back(tmp_path, expect)


def test_load_fills_cuda_targets_in_place(tmp_path: Path) -> None:
    src = {"w": torch.arange(12.0).reshape(3, 4), "h": torch.arange(6.0)}
    pckt.save(src, str(tmp_path), step=1)
    dev = torch.device("cuda", torch.cuda.current_device())
    target = {"w": torch.zeros(3, 4, device=dev),
              "h": torch.zeros(6, device=dev, dtype=torch.bfloat16)}  # a cast on the way
    ptrs = {k: v.data_ptr() for k, v in target.items()}
    pckt.load(target, str(tmp_path))
    assert all(target[k].device == dev and target[k].data_ptr() == ptrs[k] for k in target)
    assert torch.equal(target["w"].cpu(), src["w"])
    assert torch.equal(target["h"].cpu(), src["h"].to(torch.bfloat16))


def test_nccl_group_saves_and_loads_dtensors_on_a_cuda_mesh(tmp_path: Path) -> None:
    from portable_ckpt.torch.launch import run_group

    world = min(2, torch.cuda.device_count())
    res = run_group("tests.torch._cuda_workers:nccl_save_load", world, (str(tmp_path),),
                    timeout=300, pg_timeout=120, sys_path=[str(ROOT)], backend="nccl")
    res.raise_for_errors()
    for r in res.results:
        assert r["busy_ok"] and r["values_ok"] == [True, True, True, True], r
    assert len({r["ids"][0] for r in res.results}) == 1


def test_sub_mesh_samples_on_the_device_are_the_host_bytes() -> None:
    """The sub-mesh copy check samples shards where they are (last review F1: CUDA has no
    gather kernel for uint16, and every save of such a DTensor failed): for every dtype the
    format stores, contiguous and strided, the bytes equal those sampled on the host."""
    from portable_ckpt.format.dtypes import DTYPES
    from portable_ckpt.torch._tensors import torch_dtype
    from portable_ckpt.torch.plan import _spread_sample, _to_host

    for dtype in (torch_dtype(n) for n in DTYPES):  # every row (contributor review D7)
        base = torch.arange(6 * 300, dtype=torch.float64).reshape(6, 300) % 120
        host = base.to(dtype)
        for view in (lambda t: t, lambda t: t.t(), lambda t: t[2:5, 7:50], lambda t: t[0, 0]):
            want = _to_host([_spread_sample(view(host), 11, {})])[0]
            got = _to_host([_spread_sample(view(host.cuda()), 11, {})])[0]
            assert got == want and len(want) > 0, dtype
