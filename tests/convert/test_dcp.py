from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import _dist_workers  # noqa: E402

import portable_ckpt  # noqa: E402
from portable_ckpt.convert import convert  # noqa: E402
from portable_ckpt.errors import CheckpointError  # noqa: E402

pytestmark = pytest.mark.torch


def _bytes(t: Any) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


@pytest.fixture(scope="module")
def dcp_ckpt(tmp_path_factory: Any) -> tuple[Path, Path]:
    from conftest import run_ranks

    d = tmp_path_factory.mktemp("dcp")
    ckpt, ref = d / "ckpt", d / "ref.pt"
    run_ranks(_dist_workers.save_dtensor_and_fsdp, 2, str(ckpt), str(ref))
    return ckpt, ref


@pytest.fixture(scope="module")
def converted(dcp_ckpt: tuple[Path, Path], tmp_path_factory: Any) -> tuple[Path, Any]:
    ckpt, _ = dcp_ckpt
    root = tmp_path_factory.mktemp("portable") / "root"
    report = convert(ckpt, root, trust_pickle=True, step=3, keys="verbatim")
    return root, report


def test_dcp_to_portable_values(dcp_ckpt: tuple[Path, Path], converted: tuple[Path, Any]) -> None:
    ckpt, ref = dcp_ckpt
    root, report = converted
    full = torch.load(ref, weights_only=True)
    ck = portable_ckpt.open(root)
    assert ck.step == 3
    assert set(full) <= set(ck.tensors)
    # FSDP2 model + AdamW state are present under DCP's flattened keys
    assert any(k.startswith("model.") for k in ck.tensors)
    assert any(k.startswith("optim.state.") and k.endswith("exp_avg") for k in ck.tensors)
    for k, v in full.items():
        info = ck.tensors[k]
        assert info.dtype == str(v.dtype).removeprefix("torch."), k
        assert tuple(info.shape) == tuple(v.shape), k
        assert ck.read(k).reshape(-1).view(np.uint8).tobytes() == _bytes(v), k
    # the stored chunk layout is kept: sharded DTensors have one range per rank
    assert len(ck.tensors["dt.a"].ranges) == 2
    assert len(ck.tensors["dt.b"].ranges) == 2
    assert ck.tensors["dt.b"].ranges[1].offsets[1] == 5  # Shard(1) of 9 columns on 2 ranks
    assert len(ck.tensors["dt.r"].ranges) == 1  # replicated: written once
    assert ck.entry("step") == 7
    assert ck.entry("meta.name") == "run1"
    assert ck.entry("meta.lrs") == [0.1, 0.01]
    # DCP flattens param_groups to one byte item per field
    assert ck.entry("optim.param_groups.0.lr") == 1e-3
    assert ck.entry("optim.param_groups.0.betas") == [0.9, 0.999]
    assert "0.weight" in ck.entry("optim.param_groups.0.params")
    assert report.tensors == len(ck.tensors)
    assert report.largest_chunk > 0 and report.bytes == sum(i.nbytes for i in ck.tensors.values())


def test_scanner_reads_dtensor_fsdp_adamw_metadata(dcp_ckpt: tuple[Path, Path]) -> None:
    from _dcp_pickles import from_torch
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    from portable_ckpt.convert._dcp_meta import DcpBytes, DcpTensor, read_dcp_metadata

    ckpt, _ = dcp_ckpt
    got = read_dcp_metadata(str(ckpt / ".metadata"))
    assert got == from_torch(FileSystemReader(str(ckpt)).read_metadata())
    sdm = got.state_dict_metadata
    a, b = sdm["dt.a"], sdm["dt.b"]
    assert isinstance(a, DcpTensor) and isinstance(b, DcpTensor)
    assert [c.offsets for c in a.chunks] == [(0, 0), (4, 0)]  # uneven Shard(0) of 7 rows
    assert b.dtype == "bfloat16" and [c.sizes for c in b.chunks] == [(6, 5), (6, 4)]
    assert {got.storage_for("dt.a", c.offsets).relative_path for c in a.chunks} == {  # type: ignore[union-attr]
        "__0_0.distcp",
        "__1_0.distcp",
    }
    moments = [k for k, v in sdm.items() if k.startswith("optim.state.") and isinstance(v, DcpTensor)]
    assert any(k.endswith(".exp_avg") for k in moments) and any(k.endswith(".exp_avg_sq") for k in moments)
    assert isinstance(sdm["optim.param_groups.0.lr"], DcpBytes) and isinstance(sdm["step"], DcpBytes)


def test_resharded_reads_on_three_ranks(dcp_ckpt: tuple[Path, Path], converted: tuple[Path, Any], ranks: Any) -> None:
    _, ref = dcp_ckpt
    root, _ = converted
    ranks(_dist_workers.read_portable_boxes, 3, str(root), str(ref))


def test_portable_to_dcp_loads_on_other_world_sizes(
    dcp_ckpt: tuple[Path, Path], converted: tuple[Path, Any], tmp_path: Path, ranks: Any
) -> None:
    _, ref = dcp_ckpt
    root, _ = converted
    out = tmp_path / "dcp-out"
    report = convert(root, out, dst_format="dcp")
    assert (out / ".metadata").is_file()
    assert report.tensors == len(portable_ckpt.open(root).tensors)
    ranks(_dist_workers.load_dcp_into_dtensors, 3, str(out), str(ref))
    # and in one process without a process group
    import torch.distributed.checkpoint as dcp

    full = torch.load(ref, weights_only=True)
    target = {k: torch.zeros_like(v) for k, v in full.items()}
    target["step"] = 0
    dcp.load(target, checkpoint_id=str(out), no_dist=True)
    for k, v in full.items():
        assert _bytes(target[k]) == _bytes(v), k
    assert target["step"] == 7
    # and back again: the round trip keeps every byte
    root2 = tmp_path / "again"
    convert(out, root2, trust_pickle=True)
    ck2 = portable_ckpt.open(root2)
    for k, v in full.items():
        assert ck2.read(k).reshape(-1).view(np.uint8).tobytes() == _bytes(v), k


def test_dcp_to_hf_direct(dcp_ckpt: tuple[Path, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file

    ckpt, ref = dcp_ckpt
    out = tmp_path / "hf"
    convert(ckpt, out, trust_pickle=True, dst_format="hf", max_shard_size=200,
            drop_unsupported=True)  # (the step and the optimizer's values: no HF tensors)
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    loaded: dict[str, Any] = {}
    for f in set(idx["weight_map"].values()):
        loaded.update(load_file(out / f))
    full = torch.load(ref, weights_only=True)
    for k, v in full.items():
        assert torch.equal(loaded[k], v) and loaded[k].dtype == v.dtype, k
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pck-convert-")]


def test_refuses_without_trust(dcp_ckpt: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, _ = dcp_ckpt
    with pytest.raises(CheckpointError) as ei:
        convert(ckpt, tmp_path / "x")
    assert ei.value.code == "PCK-USAGE"
    assert ".metadata" in str(ei.value) and "--trust-pickle" in str(ei.value)
    assert not (tmp_path / "x").exists()


def test_cli_help_explains_pickle() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "portable_ckpt.cli.main", "convert", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert "--trust-pickle" in out and "arbitrary code" in out.replace("\n", " ")


def test_missing_metadata(dcp_ckpt: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, _ = dcp_ckpt
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    (bad / ".metadata").unlink()
    with pytest.raises(CheckpointError) as ei:
        convert(bad, tmp_path / "out", trust_pickle=True, src_format="dcp")
    assert ei.value.code == "PCK-FILE-MISSING"
    assert str(bad / ".metadata") in str(ei.value)
    assert not (tmp_path / "out").exists()


def test_truncated_distcp(dcp_ckpt: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, _ = dcp_ckpt
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    victim = sorted(bad.glob("*.distcp"))[-1]
    size = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(CheckpointError) as ei:
        convert(bad, tmp_path / "out", trust_pickle=True)
    assert ei.value.code in ("PCK-FILE-SIZE", "PCK-SHARD-HEADER")
    assert victim.name in str(ei.value)
    assert not (tmp_path / "out").exists()


def test_unsupported_dtype_in_dcp(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    src = tmp_path / "c128"  # complex64 is a dtype of format 1.3; complex128 is no row of §7
    dcp.save({"z": torch.zeros(3, dtype=torch.complex128), "ok": torch.ones(2)}, checkpoint_id=str(src), no_dist=True)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-DTYPE-UNSUPPORTED"
    assert "'z'" in str(ei.value) and ".distcp" in str(ei.value)
    assert not (tmp_path / "out").exists()


def test_unrecognised_byte_item_warns_or_fails(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    src = tmp_path / "odd"
    dcp.save({"w": torch.ones(2), "odd": {1.5, 2.5}, "n": float("nan")}, checkpoint_id=str(src), no_dist=True)
    with pytest.raises(CheckpointError, match="1 item"):  # dropped only when asked (review 26, 1)
        convert(src, tmp_path / "out", trust_pickle=True)
    report = convert(src, tmp_path / "out", trust_pickle=True, drop_unsupported=True)
    items = {w.item for w in report.warnings}
    assert items == {"odd"}  # nan is stored ({"__float__": "nan"}), a set is not JSON
    ck = portable_ckpt.open(tmp_path / "out")
    assert list(ck.tensors) == ["w"]
    assert ck.entry("torch.values") == {"n": {"__float__": "nan"}}
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out2", trust_pickle=True, strict=True)
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE"
    assert not (tmp_path / "out2").exists()


def test_cli_json(dcp_ckpt: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, _ = dcp_ckpt
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-m", "portable_ckpt.cli.main", "convert", str(ckpt), str(tmp_path / "o"),
         "--trust-pickle", "--json"],
        capture_output=True, text=True, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["source_format"] == "dcp" and doc["tensors"] > 5 and doc["bytes"] > 0
    proc = subprocess.run(
        [sys.executable, "-m", "portable_ckpt.cli.main", "convert", str(ckpt), str(tmp_path / "p"), "--json"],
        capture_output=True, text=True, env=env,
    )
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"]["code"] == "PCK-USAGE"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "portable_ckpt.cli.main", *args],
                          capture_output=True, text=True, timeout=120)


def test_a_dcp_item_the_format_cannot_store_fails_the_conversion_unless_dropped(
    tmp_path: Path,
) -> None:
    """DCP integrator review 26, 1: torchtitan's pickled dataloader state (bytes, io.BytesIO)
    was dropped with a warning and exit 0 (only --strict failed): the migrated job resumed
    without its data position. Dropping an item now fails by default, naming the items (the
    first five and their number), why, and the opt-in --drop-unsupported; nothing is written."""
    import io
    import pickle

    import torch.distributed.checkpoint as dcp

    src, dst = tmp_path / "dcp" / "step-3", tmp_path / "portable"
    state: dict[str, Any] = {
        "model": {"w": torch.arange(6.0)},
        "train_state": {"step": 3},
        "dataloader": {"dp_rank_0": pickle.dumps({"pos": 10}), "world_size": 1},
        "losses": io.BytesIO(b"\x00\x01"),
        "xtra": {f"blob{i}": pickle.dumps(i) for i in range(5)},  # listed after those
    }
    dcp.save(state, checkpoint_id=str(src), no_dist=True)

    got = _cli("convert", str(src), str(dst), "--trust-pickle")
    assert got.returncode == 1, got.stderr
    err = got.stderr
    assert "[PCK-UNSUPPORTED-VALUE] 7 item(s) cannot be stored in the portable format" in err, err
    assert "dataloader.dp_rank_0: " in err and "a bytes value" in err, err
    assert "losses: " in err and "BytesIO" in err, err
    assert "(and 2 more)" in err and "--drop-unsupported" in err, err
    assert "stored as JSON data" in err and "base64" in err, err
    assert not dst.exists()
    with pytest.raises(CheckpointError) as ei:  # the Python API: the same refusal
        convert(src, dst, trust_pickle=True)
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE" and "drop_unsupported=True" in str(ei.value)
    assert not dst.exists()

    # through a temporary version (DCP -> HF): the same refusal, naming DST, not the staging
    got = _cli("convert", str(src), str(tmp_path / "hf"), "--to", "hf", "--trust-pickle")
    assert got.returncode == 1 and "7 item(s)" in got.stderr, got.stderr
    assert f"nothing was written to {tmp_path / 'hf'}:" in got.stderr, got.stderr
    assert not (tmp_path / "hf").exists() and ".pck-staging" not in got.stderr

    # --strict refuses them too (and what would be changed); with --drop-unsupported: usage
    got = _cli("convert", str(src), str(dst), "--trust-pickle", "--strict")
    assert got.returncode == 1 and "--strict: 7 item(s)" in got.stderr, got.stderr
    # an import: not "--select what to export", which an import refuses (re-attack 26b)
    assert "--select" not in got.stderr, got.stderr
    got = _cli("convert", str(src), str(dst), "--trust-pickle", "--strict", "--drop-unsupported")
    assert got.returncode == 2 and "PCK-USAGE" in got.stderr, got.stderr
    assert not dst.exists()

    # dropped knowingly: every item named in a warning, the rest converted
    got = _cli("convert", str(src), str(dst), "--trust-pickle", "--drop-unsupported")
    assert got.returncode == 0, got.stderr
    assert got.stderr.count("warning: ") == 7, got.stderr
    assert "warning: dataloader.dp_rank_0: " in got.stderr and "warning: losses: " in got.stderr
    ck = portable_ckpt.open(dst)
    assert list(ck.tensors) == ["model/w"] and ck.step == 3
    assert ck.entry("torch.values") == {"dataloader/world_size": 1, "train_state/step": 3}
    report = convert(src, tmp_path / "api", trust_pickle=True, drop_unsupported=True)
    dropped = sorted(w.item for w in report.warnings if w.kind == "skipped")
    assert dropped == sorted(["dataloader.dp_rank_0", "losses",
                              *(f"xtra.blob{i}" for i in range(5))])


# -- mapped keys (the default): conversions that round-trip into the job's own state ------------


def _zeros_like_nested(node: Any) -> Any:
    """The load target a job builds: the same structure, tensors zeroed, scalars reset."""
    if isinstance(node, torch.Tensor):
        return torch.zeros_like(node)
    if isinstance(node, dict):
        return {k: _zeros_like_nested(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return type(node)(_zeros_like_nested(v) for v in node)
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int | float):
        return type(node)(0)
    return "" if isinstance(node, str) else node


def _assert_same_nested(got: Any, want: Any, where: str = "") -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype, where
        assert _bytes(got) == _bytes(want), where
    elif isinstance(want, dict):
        assert set(got) == set(want), (where, set(got) ^ set(want))
        for k in want:
            _assert_same_nested(got[k], want[k], f"{where}/{k}")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where  # a tuple may come back as a list (JSON has none)
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same_nested(g, w, f"{where}/{i}")
    else:
        assert got == want and type(got) is type(want), (where, got, want)


@pytest.fixture(scope="module")
def mapped(dcp_ckpt: tuple[Path, Path], tmp_path_factory: Any) -> tuple[Path, Any, Any]:
    ckpt, ref = dcp_ckpt
    root = tmp_path_factory.mktemp("mapped") / "root"
    report = convert(ckpt, root, trust_pickle=True)  # no --step: the source's 'step' value
    return root, report, torch.load(str(ref) + ".nested", weights_only=True)


def test_dcp_mapped_keys_and_inferred_step(mapped: tuple[Path, Any, Any]) -> None:
    root, report, nested = mapped
    ck = portable_ckpt.open(root)
    assert ck.step == 7 and report.step == 7 and "'step'" in report.step_source
    # DCP's path of each item, with the key rule of portable_ckpt.torch (not the dotted FQN)
    assert {"dt/a", "dt/b", "dt/r", "model/0.weight", "model/2.bias"} <= set(ck.tensors)
    assert "optim/state/0.weight/exp_avg" in ck.tensors
    assert not any("." in k.split("/")[0] for k in ck.tensors)
    values = ck.entry("torch.values")
    assert values["step"] == 7 and values["meta/name"] == "run1" and values["meta/lrs/1"] == 0.01
    assert values["optim/param_groups/0/lr"] == 1e-3
    assert list(ck.entries) == ["torch.values", "torch.dcp_items"]
    # list positions stay ints in the recorded DCP paths; a list of plain values is one item
    items = ck.entry("torch.dcp_items")
    assert ["optim", "param_groups", 0, "lr"] in items and ["meta", "lrs"] in items, items


def test_dcp_mapped_loads_with_portable_torch_load(mapped: tuple[Path, Any, Any]) -> None:
    import portable_ckpt.torch as pckt

    root, _, nested = mapped
    target = _zeros_like_nested(nested)  # the nested state the same job uses
    pckt.load(target, root, allow_statistical=True)  # saved on 2 ranks, loaded on 1
    _assert_same_nested(target, nested)


def test_dcp_mapped_back_to_dcp_loads_nested_state(
    mapped: tuple[Path, Any, Any], dcp_ckpt: tuple[Path, Path], tmp_path: Path
) -> None:
    import torch.distributed.checkpoint as dcp

    root, _, nested = mapped
    out = tmp_path / "dcp"
    convert(root, out, dst_format="dcp")
    target = _zeros_like_nested(nested)
    dcp.load(target, checkpoint_id=str(out), no_dist=True)  # stock DCP, nested state
    _assert_same_nested(target, nested)
    # DCP's items and object paths are the source's: its own template-free conversion works
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    src_md = FileSystemReader(str(dcp_ckpt[0])).read_metadata()
    out_md = FileSystemReader(str(out)).read_metadata()
    assert set(out_md.state_dict_metadata) == set(src_md.state_dict_metadata)
    assert out_md.planner_data == src_md.planner_data
    dcp_to_torch_save(str(out), str(tmp_path / "whole.pt"))
    _assert_same_nested(torch.load(tmp_path / "whole.pt"), nested)
    # and DCP -> portable again: the same keys, the paths recorded in planner_data
    again = tmp_path / "again"
    convert(out, again, trust_pickle=True)
    assert set(portable_ckpt.open(again).tensors) == set(portable_ckpt.open(root).tensors)


def test_dcp_mapped_to_torch_save(mapped: tuple[Path, Any, Any], tmp_path: Path) -> None:
    root, _, nested = mapped
    out = tmp_path / "state.pt"
    report = convert(root, out, dst_format="torch")
    assert report.target_format == "torch" and out.is_file()
    back = torch.load(out, weights_only=True)
    _assert_same_nested(back, nested)
    assert not [p for p in tmp_path.iterdir() if p.name != "state.pt"]  # no scratch left


def test_dcp_step_flag_wins_and_verbatim_keeps_fqns(
    dcp_ckpt: tuple[Path, Path], tmp_path: Path
) -> None:
    ckpt, _ = dcp_ckpt
    report = convert(ckpt, tmp_path / "r", trust_pickle=True, step=11, keys="verbatim")
    assert report.step == 11 and report.step_source == "--step"
    ck = portable_ckpt.open(tmp_path / "r")
    assert "dt.a" in ck.tensors and ck.entry("step") == 7


def test_damaged_source_to_dcp_is_one_line_error(converted: tuple[Path, Any], tmp_path: Path) -> None:
    """A checksum failure met while DCP's writer pulls the data is ours, not DCP's wrapper."""
    root, _ = converted
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    victim = max(bad.glob("*/data/*.safetensors"), key=lambda p: p.stat().st_size)
    with open(victim, "r+b") as f:
        f.seek(victim.stat().st_size - 16)
        old = f.read(4)
        f.seek(-4, 1)
        f.write(bytes(b ^ 0xFF for b in old))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "portable_ckpt.cli.main", "convert", str(bad), str(out), "--to", "dcp"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 1, proc.stderr
    assert "[PCK-CHECKSUM]" in proc.stderr and victim.name in proc.stderr
    assert "Traceback" not in proc.stderr and "bug" not in proc.stderr
    assert "UserWarning" not in proc.stderr
    assert not out.exists()


# -- hostile .metadata against a genuine single-process dcp.save (attack review H2, M2) -----------


def _single_rank_dcp(d: Path) -> Path:
    """A genuine one-process ``dcp.save`` checkpoint (one ``__0_0.distcp``)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    sd = {"model": {"a": torch.arange(8, dtype=torch.float32), "b": torch.ones(2, 3)}, "step": 7}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(d), single_file_per_rank=True))
    return d


def _rewrite_metadata(d: Path, change: Any) -> None:
    import pickle

    md = pickle.loads((d / ".metadata").read_bytes())
    change(md)
    (d / ".metadata").write_bytes(pickle.dumps(md))


def _count_zip_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from portable_ckpt.convert import dcp as dcp_mod

    calls: list[int] = []
    real = dcp_mod.parse_torch_zip

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dcp_mod, "parse_torch_zip", counting)
    return calls


def test_a_chunk_listed_many_times_is_refused_before_any_zip_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _single_rank_dcp(tmp_path / "src")

    def repeat(md: Any) -> None:  # pickled as memo references: a few bytes each
        t = md.state_dict_metadata["model.a"]
        t.chunks = [t.chunks[0]] * 2000

    _rewrite_metadata(src, repeat)
    parses = _count_zip_parses(monkeypatch)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-COVERAGE-OVERLAP"
    assert str(src / ".metadata") in str(ei.value) and "model.a" in str(ei.value)
    assert parses == []  # decided from .metadata alone (each chunk reference parsed its zip)
    assert not (tmp_path / "out").exists()


def test_items_whose_bytes_overlap_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _single_rank_dcp(tmp_path / "src")

    def overlap(md: Any) -> None:
        a = next(v for k, v in md.storage_data.items() if k.fqn == "model.a")
        b = next(v for k, v in md.storage_data.items() if k.fqn == "model.b")
        b.relative_path, b.offset, b.length = a.relative_path, a.offset + 1, a.length

    _rewrite_metadata(src, overlap)
    parses = _count_zip_parses(monkeypatch)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-SHARD-HEADER" and "overlap" in str(ei.value)
    assert "model.a" in str(ei.value) and "model.b" in str(ei.value)
    assert str(src / ".metadata") in str(ei.value) and parses == []


def dcp_chunk_of_members(tmp_path: Path, members: int) -> Path:
    """The one-process DCP source with ``model.a``'s chunk a ``torch.save`` zip of ``members``."""
    import io
    import zipfile

    src = _single_rank_dcp(tmp_path / "src")
    buf = io.BytesIO()
    torch.save(torch.arange(8, dtype=torch.float32), buf)
    real = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    fat = io.BytesIO()
    with zipfile.ZipFile(fat, "w", zipfile.ZIP_STORED) as z:
        for info in real.infolist():
            z.writestr(info, real.read(info))
        for k in range(members - len(real.infolist())):
            z.writestr(f"archive/pad/{k}", b"")
    (src / "__1_0.distcp").write_bytes(fat.getvalue())

    def point(md: Any) -> None:
        a = next(v for k, v in md.storage_data.items() if k.fqn == "model.a")
        a.relative_path, a.offset, a.length = "__1_0.distcp", 0, len(fat.getvalue())

    _rewrite_metadata(src, point)
    return src


def test_a_chunk_zip_of_many_members_is_refused(tmp_path: Path) -> None:
    # every parse of the chunk read the whole central directory
    src = dcp_chunk_of_members(tmp_path, 500)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-SHARD-HEADER" and "members" in str(ei.value)
    assert str(src / "__1_0.distcp") in str(ei.value)


def test_world_size_is_what_the_rank_files_show(tmp_path: Path) -> None:
    src = _single_rank_dcp(tmp_path / "src")
    ok = convert(src, tmp_path / "ok", trust_pickle=True)
    assert not ok.warnings
    assert portable_ckpt.open(str(tmp_path / "ok")).continuation.to_json()["world_size"] == 1
    (src / "__0_0.distcp").rename(src / "__4000000_0.distcp")  # one renamed file

    def rename(md: Any) -> None:
        for v in md.storage_data.values():
            v.relative_path = "__4000000_0.distcp"

    _rewrite_metadata(src, rename)
    report = convert(src, tmp_path / "out", trust_pickle=True)
    cont = portable_ckpt.open(str(tmp_path / "out")).continuation
    assert (cont.contract, cont.world_size) == ("statistical", 1)  # not exact for 4000001
    (w,) = report.warnings
    assert "4000000" in w.message and "statistical" in w.message and w.item == str(src / ".metadata")
    with pytest.raises(CheckpointError, match="statistical"):  # --strict: the contract changed
        convert(src, tmp_path / "strict", trust_pickle=True, strict=True)


def test_a_byte_item_of_many_tensors_is_a_torch_save(tmp_path: Path) -> None:
    # rev22 D12: DCP stores a tuple as one byte item; a tuple of 70 tensors is a torch.save zip
    # of more than 64 members, which was "not a torch.save zip"
    import torch.distributed.checkpoint as dcp

    src = tmp_path / "src"
    dcp.save({"w": torch.arange(4.0), "pair": tuple(torch.full((2,), float(i)) for i in range(70))},
             checkpoint_id=str(src))
    report = convert(src, tmp_path / "out", trust_pickle=True, drop_unsupported=True)
    (w,) = [w for w in report.warnings if w.item == "pair"]
    assert "a tensor value" in w.message and "members" not in w.message, w.message
    assert report.tensors == 1
