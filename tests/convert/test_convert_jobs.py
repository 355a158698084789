"""Conversions that round-trip into real jobs: torch.save ↔ portable, HF exports that
``transformers`` loads, recompression that keeps every entry, ``--strict``, the format registry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.convert import (
    FORMATS,
    ChunkSpec,
    ConvertOptions,
    EntrySpec,
    Format,
    SourcePlan,
    TensorSpec,
    WriteResult,
    convert,
)
from portable_ckpt.errors import CheckpointError


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "portable_ckpt.cli.main", *args], capture_output=True, text=True
    )


# -- a version with per-rank entries, written without torch ----------------------------------


def _two_writer_version(root: Path) -> np.ndarray:
    from portable_ckpt.format.manifest import Continuation
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    w_full = np.arange(12, dtype=np.float32).reshape(4, 3)
    st = open_storage(str(root), create=True)
    aid = new_attempt_id(9)
    idx = []
    for r in range(2):
        w = ShardWriter(st, aid, r)
        w.add_tensor("model/w", w_full[2 * r : 2 * r + 2], offsets=(2 * r, 0), global_shape=(4, 3))
        w.add_entry("rng", {"seed": 100 + r}, scope="per_rank", rank=r, world_size_policy="require_same")
        w.add_entry("data", {"pos": 10 + r}, scope="per_rank", rank=r, world_size_policy="rank0", compress=True)
        if r == 0:
            w.add_tensor("optim/m", np.ones(3, dtype=np.float32))
            w.add_entry("sched", {"lr": 0.1}, {"json_schema": {"type": "object", "required": ["lr"]}})
        idx.append(w.finish())
    commit(st, aid, step=9, indexes=idx, continuation=Continuation("statistical", 2))
    return w_full


def _decl(ck: Any) -> dict[str, Any]:
    return {n: (e.schema, e.scope, e.world_size_policy, e.encoding) for n, e in ck.entries.items()}


def test_recompress_keeps_per_rank_entries_and_contract(tmp_path: Path) -> None:
    w_full = _two_writer_version(tmp_path / "a")
    rep = convert(tmp_path / "a", tmp_path / "b", codec="zstd")
    src, out = portable_ckpt.open(tmp_path / "a"), portable_ckpt.open(tmp_path / "b")
    assert rep.step == out.step == 9 and rep.entries == 3 and not rep.warnings
    assert _decl(out) == _decl(src)  # schema documents, scope, policy, encoding
    for r in range(2):
        assert out.entry("rng", rank=r) == {"seed": 100 + r}
        assert out.entry("data", rank=r) == {"pos": 10 + r}
    assert out.entry("sched") == {"lr": 0.1}
    assert (out.continuation.contract, out.continuation.world_size) == ("statistical", 2)
    assert {r.codec for t in out.tensors.values() for r in t.ranges} == {"zstd"}
    assert np.array_equal(out.read("model/w"), w_full)
    assert out.verify(deep=True) == []


def test_strict_fails_on_anything_not_converted(tmp_path: Path) -> None:
    _two_writer_version(tmp_path / "a")
    with pytest.raises(CheckpointError) as ei:
        convert(tmp_path / "a", tmp_path / "hf", dst_format="hf", strict=True)
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE"
    assert "'rng'" not in str(ei.value) and "rng:" in str(ei.value) and "--select" in str(ei.value)
    assert not (tmp_path / "hf").exists()
    # the CLI: exit 1 under --strict, 0 with the warnings otherwise; --select what HF can hold
    proc = _cli("convert", str(tmp_path / "a"), str(tmp_path / "hf"), "--to", "hf", "--strict")
    assert proc.returncode == 1 and "PCK-UNSUPPORTED-VALUE" in proc.stderr and not (tmp_path / "hf").exists()
    # without --strict the entries HF cannot hold fail the export too (review 26, 1), naming
    # them; --drop-unsupported exports without them, each a warning
    proc = _cli("convert", str(tmp_path / "a"), str(tmp_path / "hf"), "--to", "hf")
    assert proc.returncode == 1 and "have no place in a hf target" in proc.stderr, proc.stderr
    assert "rng:" in proc.stderr and "--drop-unsupported" in proc.stderr, proc.stderr
    assert not (tmp_path / "hf").exists()
    proc = _cli("convert", str(tmp_path / "a"), str(tmp_path / "hf"), "--to", "hf",
                "--drop-unsupported")
    assert proc.returncode == 0 and proc.stderr.count("warning:") == 3, proc.stderr
    proc = _cli("convert", str(tmp_path / "a"), str(tmp_path / "hf2"), "--to", "hf", "--strict",
                "--select", "model/*", "--strip-prefix", "model/")
    assert proc.returncode == 0, proc.stderr
    from safetensors.numpy import load_file

    assert list(load_file(tmp_path / "hf2" / "model.safetensors")) == ["w"]


def test_export_options_are_refused_for_portable_targets(tmp_path: Path) -> None:
    _two_writer_version(tmp_path / "a")
    proc = _cli("convert", str(tmp_path / "a"), str(tmp_path / "b"), "--dtype", "bf16")
    assert proc.returncode == 2 and "--to hf" in proc.stderr and not (tmp_path / "b").exists()
    proc = _cli("convert", str(tmp_path / "a"), str(tmp_path / "h"), "--to", "hf", "--dtype", "int8")
    assert proc.returncode == 2 and "bf16" in proc.stderr
    proc = _cli("convert", str(tmp_path / "a"), str(tmp_path / "h"), "--to", "hf", "--select", "nope/*")
    assert proc.returncode == 2 and "matches no tensor" in proc.stderr and not (tmp_path / "h").exists()


def test_step_inference_says_where_it_came_from() -> None:
    from portable_ckpt.convert._model import infer_step

    # a value beats the name; the shallowest 'step' wins; 'step' beats 'global_step'
    assert infer_step([("optim/state/0/step", 5), ("step", 12)], "/c/step-3") == (12, "the source's 'step' value")
    assert infer_step([("trainer.global_step", 9), ("a.step", 4)], "x") == (4, "the source's 'step' value")
    assert infer_step([("global_step", 9)], "x")[0] == 9
    # several different values at the same depth say nothing: the name decides
    assert infer_step([("a/step", 1), ("b/step", 2)], "/runs/step-30/") == (30, "the source's name 'step-30'")
    assert infer_step([("step", True), ("step2", 4), ("step", -1)], "x") == (None, "")  # not counts
    for name, step in [("checkpoint-500", 500), ("global_step100", 100), ("iter_0000100", 100),
                       ("step_100.pt", 100), ("model.ckpt-7", 7)]:
        assert infer_step([], f"/ckpts/{name}")[0] == step, name
    for name in ["model.safetensors", "run2", "stepper", "epoch-3"]:
        assert infer_step([], f"/ckpts/{name}") == (None, ""), name


# -- the registry: a new format is one entry ---------------------------------------------------


def _read_npz(src: str, options: ConvertOptions) -> SourcePlan:
    data = np.load(src)
    tensors = []
    for k in sorted(data.files):
        a = data[k]
        tensors.append(
            TensorSpec(k, str(a.dtype), a.shape, [ChunkSpec((0,) * a.ndim, a.shape, a.nbytes, src, lambda a=a: a)])
        )
    return SourcePlan("npz", tensors)


def _write_npz(ck: Any, dst: str, options: ConvertOptions, progress: Any) -> WriteResult:
    arrays = {k: ck.read(k) for k in ck.tensors}
    with open(dst, "wb") as f:
        np.savez(f, **arrays)
    return WriteResult(len(arrays), sum(a.nbytes for a in arrays.values()))


def test_a_new_format_is_one_registry_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fmt = Format(
        name="npz",
        help="numpy .npz archives",
        reader=f"{__name__}:_read_npz",
        writer=f"{__name__}:_write_npz",
        detect=lambda p: p.endswith(".npz"),
        destination="file",
    )
    monkeypatch.setitem(FORMATS, "npz", fmt)
    np.savez(tmp_path / "a.npz", w=np.arange(6.0).reshape(2, 3), b=np.array([1, 2], dtype=np.int32))
    rep = convert(tmp_path / "a.npz", tmp_path / "root")  # detected through the entry
    assert rep.source_format == "npz" and portable_ckpt.open(tmp_path / "root").tensors["w"].shape == (2, 3)
    convert(tmp_path / "root", tmp_path / "b.npz", dst_format="npz")
    back = np.load(tmp_path / "b.npz")
    assert np.array_equal(back["w"], np.arange(6.0).reshape(2, 3)) and back["b"].dtype == np.int32
    # the CLI's choices and help come from the same table
    from portable_ckpt.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["convert"]  # type: ignore[union-attr]
    choices = {a.dest: a.choices for a in sub._actions if a.dest in ("src_format", "dst_format")}
    assert "npz" in choices["src_format"] and "npz" in choices["dst_format"]
    assert "numpy .npz archives" in sub.format_help()


_NPZ_PKG = """\
import numpy as np
from portable_ckpt.convert import ChunkSpec, Format, SourcePlan, TensorSpec, WriteResult

def read_source(src, options):
    data = np.load(src)
    return SourcePlan("npz", [
        TensorSpec(k, str(data[k].dtype), data[k].shape,
                   [ChunkSpec((0,) * data[k].ndim, data[k].shape, data[k].nbytes, src,
                              lambda a=data[k]: a)])
        for k in sorted(data.files)])

def write_target(ck, dst, options, progress):
    arrays = {k: ck.read(k) for k in ck.tensors}
    with open(dst, "wb") as f:
        np.savez(f, **arrays)
    return WriteResult(len(arrays), sum(a.nbytes for a in arrays.values()))

FORMAT = Format(name="npz", help="numpy .npz archives (an installed package)",
                reader="npz_pkg:read_source", writer="npz_pkg:write_target",
                detect=lambda p: p.endswith(".npz"), destination="file")
"""


def test_an_installed_package_adds_a_format_to_the_cli(tmp_path: Path) -> None:
    """Extension review F9: a format reached the CLI only through a wrapper script; an installed
    package now adds it through the entry-point group ``portable_ckpt.convert``, built from
    public names only. A broken entry point is skipped with a warning, never fatal."""
    import os

    site = tmp_path / "site"
    info = site / "npz_pkg-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: npz-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[portable_ckpt.convert]\nnpz = npz_pkg:FORMAT\nbroken = npz_pkg:NO_SUCH_NAME\n")
    (site / "npz_pkg.py").write_text(_NPZ_PKG)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    np.savez(tmp_path / "a.npz", w=np.arange(6.0).reshape(2, 3), b=np.array([1, 2], dtype=np.int32))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "portable_ckpt", *args], env=env,
                              capture_output=True, text=True, timeout=300)

    got = cli("convert", str(tmp_path / "a.npz"), str(tmp_path / "root"))  # detected
    assert got.returncode == 0, got.stderr
    assert "format 'broken' of entry point npz_pkg:NO_SUCH_NAME is skipped" in got.stderr, got.stderr
    assert portable_ckpt.open(tmp_path / "root").tensors["w"].shape == (2, 3)
    got = cli("convert", str(tmp_path / "root"), str(tmp_path / "b.npz"), "--to", "npz")
    assert got.returncode == 0, got.stderr
    back = np.load(tmp_path / "b.npz")
    assert np.array_equal(back["w"], np.arange(6.0).reshape(2, 3)) and back["b"].dtype == np.int32
    assert "(an installed package)" in cli("convert", "--help").stdout


def test_missing_dependency_names_the_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        FORMATS,
        "needy",
        Format(name="needy", help="x", reader=f"{__name__}:_read_npz",
               read_requires=("pck_no_such_module",), install="pip install needy"),
    )
    np.savez(tmp_path / "a.npz", w=np.zeros(2))
    with pytest.raises(CheckpointError) as ei:
        convert(tmp_path / "a.npz", tmp_path / "root", src_format="needy")
    assert ei.value.code == "PCK-USAGE" and "pip install needy" in str(ei.value)
    assert "pck_no_such_module" in str(ei.value) and not (tmp_path / "root").exists()
    with pytest.raises(CheckpointError) as ei:
        convert(tmp_path / "a.npz", tmp_path / "root", src_format="nope")
    assert ei.value.code == "PCK-USAGE" and "dcp" in str(ei.value)


# -- torch.save <-> portable, into the job's own objects ----------------------------------------

torch = pytest.importorskip("torch")


def _same(got: Any, want: Any, where: str = "") -> None:
    if isinstance(want, torch.Tensor):
        assert torch.equal(got, want) and got.dtype == want.dtype, where
    elif isinstance(want, dict):
        assert set(got) == set(want), (where, set(got) ^ set(want))
        for k in want:
            _same(got[k], want[k], f"{where}/{k}")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}/{i}")
    else:
        assert got == want, (where, got, want)


def _job(seed: int) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(2):
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
    return model, opt


@pytest.mark.torch
def test_torch_save_round_trips_into_the_job(tmp_path: Path) -> None:
    import portable_ckpt.torch as pckt

    model, opt = _job(0)
    src = tmp_path / "step-40.pt"
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3}, src)
    rep = convert(src, tmp_path / "root")
    assert rep.step == 40 and "step-40.pt" in rep.step_source and not rep.warnings
    ck = portable_ckpt.open(tmp_path / "root")
    assert {"model/0.weight", "optim/state/0/exp_avg", "optim/state/3/step"} <= set(ck.tensors)
    # the job's own objects load the converted version (the keys portable_ckpt.torch.save writes)
    model2, opt2 = _job(1)
    state = {"model": model2, "optim": opt2, "epoch": 0}
    pckt.load(state, tmp_path / "root")
    assert state["epoch"] == 3
    _same(model2.state_dict(), model.state_dict())
    _same(opt2.state_dict(), opt.state_dict())
    # and back: one torch.save file that torch.load(weights_only=True) reads, into fresh objects
    out = tmp_path / "back.pt"
    convert(tmp_path / "root", out, dst_format="torch")
    back = torch.load(out, weights_only=True)
    model3, opt3 = _job(2)
    model3.load_state_dict(back["model"])
    opt3.load_state_dict(back["optim"])
    assert back["epoch"] == 3 and isinstance(back["optim"]["state"], dict)
    _same(model3.state_dict(), model.state_dict())
    _same(opt3.state_dict(), opt.state_dict())
    with pytest.raises(CheckpointError) as ei:  # the target exists: nothing is overwritten
        convert(tmp_path / "root", out, dst_format="torch")
    assert ei.value.code == "PCK-USAGE"


@pytest.mark.torch
def test_torch_target_keeps_a_dict_keyed_0_to_n(tmp_path: Path) -> None:
    """With the version's item record, a dict keyed 0..n-1 stays a dict and lists stay lists;
    without it (an older version) the keys 0..n-1 of plain values make a list."""
    import portable_ckpt.torch as pckt

    state = {
        "w": torch.ones(2),
        "workers": {"0": "w0", "1": "w1"},
        "hist": [1.5, 2.5],
        "groups": [{"lr": 0.5, "params": [0, 1]}],
        "mixed": [torch.zeros(1), 7],
    }
    pckt.save(state, tmp_path / "root", step=1)
    convert(tmp_path / "root", tmp_path / "a.pt", dst_format="torch")
    back = torch.load(tmp_path / "a.pt", weights_only=True)
    assert back["workers"] == {"0": "w0", "1": "w1"}  # strings, as saved (odd-states O3)
    assert back["hist"] == [1.5, 2.5] and back["groups"] == [{"lr": 0.5, "params": [0, 1]}]
    assert isinstance(back["mixed"], list) and back["mixed"][1] == 7
    leaves = {"workers/0": "w0", "workers/1": "w1", "hist/0": 1.5}
    portable_ckpt.save_arrays(tmp_path / "old", {"w": np.ones(2, np.float32)}, step=1,
                              entries={"torch.values": leaves})
    convert(tmp_path / "old", tmp_path / "b.pt", dst_format="torch")
    back = torch.load(tmp_path / "b.pt", weights_only=True)
    assert back["workers"] == ["w0", "w1"] and back["hist"] == [1.5]


@pytest.mark.torch
def test_torch_save_lists_stay_lists_through_every_target(tmp_path: Path) -> None:
    """A torch.save file's lists and tuples of tensors come back as lists from the torch and
    DCP targets (they came back as dicts keyed 0..n-1): the conversion records the same
    ``torch.dcp_items`` as ``portable_ckpt.torch.save`` of the same state."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    import portable_ckpt.torch as pckt
    from portable_ckpt.format.keys import recorded_items

    state = {
        "ws": [torch.arange(3.0), torch.ones(2, 2)],
        "nested": {"l": [torch.zeros(1), {"x": torch.ones(1)}], "t": (torch.ones(1), 3)},
        "groups": [{"lr": 0.5, "params": [0, 1]}],
        "names": ["a", "b"],
        "n": 5,
    }
    want = {**state, "nested": {"l": state["nested"]["l"], "t": [torch.ones(1), 3]}}
    torch.save(state, tmp_path / "a.pt")
    convert(tmp_path / "a.pt", tmp_path / "root")
    pckt.save(state, tmp_path / "native", step=0)
    record = recorded_items(portable_ckpt.open(tmp_path / "root"))
    assert record is not None and record == recorded_items(portable_ckpt.open(tmp_path / "native"))
    convert(tmp_path / "root", tmp_path / "b.pt", dst_format="torch")
    _same(torch.load(tmp_path / "b.pt", weights_only=True), want)
    convert(tmp_path / "root", tmp_path / "dcp", dst_format="dcp")
    sd: dict[str, Any] = {}
    _load_state_dict(sd, storage_reader=FileSystemReader(str(tmp_path / "dcp")),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    _same(sd, want)
    back = {"ws": [torch.zeros(3), torch.zeros(2, 2)], "nested": {"l": [torch.ones(1), {"x": torch.zeros(1)}],
            "t": [torch.zeros(1), 0]}, "groups": [{"lr": 0.0, "params": [9, 9]}], "names": [], "n": 0}
    pckt.load(back, tmp_path / "root")
    _same(back, want)


@pytest.mark.torch
@pytest.mark.parametrize(
    ("select", "strip", "want"),
    [
        (None, None, {"app": {"lst": [0, 1], "hist": [1, 2], "opt": [{"lr": 0.5}]}, "other": 1}),
        (["app/*"], None, {"app": {"lst": [0, 1], "hist": [1, 2], "opt": [{"lr": 0.5}]}}),
        (None, "app/", {"lst": [0, 1], "hist": [1, 2], "opt": [{"lr": 0.5}], "other": 1}),
        (["app/hist*", "app/opt/*"], "app/", {"hist": [1, 2], "opt": [{"lr": 0.5}]}),
    ],
)
def test_dcp_target_select_and_strip_keep_items_and_lists(
    tmp_path: Path, select: Any, strip: Any, want: Any
) -> None:
    """--select and --strip-prefix apply to non-tensor values leaf by leaf, as to tensors, and
    the exported DCP checkpoint keeps which containers were lists (its planner_data)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    import portable_ckpt.torch as pckt

    state = {
        "app": {"lst": [torch.zeros(1), torch.ones(1)], "hist": [1, 2], "opt": [{"lr": 0.5}]},
        "other": 1,
    }
    pckt.save(state, tmp_path / "root", step=1)
    out = tmp_path / "dcp"
    convert(tmp_path / "root", out, dst_format="dcp", select=select, strip_prefix=strip)
    sd: dict[str, Any] = {}
    _load_state_dict(sd, storage_reader=FileSystemReader(str(out)),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)

    def plain(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [plain(x) for x in v]
        return int(v.item()) if isinstance(v, torch.Tensor) else v

    assert plain(sd) == want


@pytest.mark.torch
def test_torch_target_verbatim_is_flat(tmp_path: Path) -> None:
    model, _ = _job(0)
    torch.save({"model": model.state_dict()}, tmp_path / "a.pt")
    convert(tmp_path / "a.pt", tmp_path / "root", keys="verbatim")
    convert(tmp_path / "root", tmp_path / "flat.pt", dst_format="torch", keys="verbatim")
    flat = torch.load(tmp_path / "flat.pt", weights_only=True)
    _same(flat, {f"model.{k}": v for k, v in model.state_dict().items()})


# -- HF export that transformers loads as is ---------------------------------------------------


def tiny_llama_config(transformers: Any) -> Any:
    """A Llama of 2 layers and 16 hidden units, embeddings not tied (the tests' model)."""
    return transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
        tie_word_embeddings=False,
    )


@pytest.mark.torch
def test_hf_export_loads_in_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    import portable_ckpt.torch as pckt

    cfg = tiny_llama_config(transformers)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 64, (1, 8)), labels=torch.randint(0, 64, (1, 8))).loss.backward()
    opt.step()
    pckt.save({"model": model, "optim": opt, "epoch": 1}, tmp_path / "root", step=5)

    out = tmp_path / "hf"
    rep = convert(tmp_path / "root", out, dst_format="hf", select=["model/*"],
                  strip_prefix="model/", dtype="bf16", max_shard_size="4KB", strict=True)
    want = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(idx["weight_map"]) == set(want)  # no optimizer moments, no "model/" prefix
    assert idx["metadata"]["total_size"] == sum(v.numel() * 2 for v in want.values())
    shards = sorted(p.name for p in out.iterdir() if p.suffix == ".safetensors")
    assert len(shards) > 2 and set(idx["weight_map"].values()) == set(shards)
    got: dict[str, Any] = {}
    for name in shards:  # safetensors' own loader, then transformers' own
        got.update(load_file(out / name))
        from transformers.modeling_utils import load_state_dict

        assert set(load_state_dict(str(out / name))) == set(load_file(out / name))
    _same(got, want)
    assert rep.tensors == len(want) and not rep.warnings
    cfg.save_pretrained(out)
    loaded, info = transformers.LlamaForCausalLM.from_pretrained(
        out, dtype=torch.bfloat16, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    _same(loaded.state_dict(), want)
    assert os.listdir(tmp_path) == ["root", "hf"] or set(os.listdir(tmp_path)) == {"root", "hf"}


def test_hf_export_without_tensors_is_a_usage_error(tmp_path: Path) -> None:
    """Re-check of the review: --select matching only values wrote an empty model.safetensors."""
    portable_ckpt.save_arrays(tmp_path / "root", {"model/w": np.ones(2, np.float32)}, step=1,
                              entries={"torch.values": {"app/lr": 0.5}})
    with pytest.raises(CheckpointError) as ei:
        convert(tmp_path / "root", tmp_path / "hf", dst_format="hf", select=["app/*"])
    assert ei.value.code == "PCK-USAGE" and "no tensor" in ei.value.message
    assert not (tmp_path / "hf").exists()


def test_a_torch_export_is_not_written_through_a_symlink_planted_at_its_staged_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenant review F4: the staged file's name was told by `<tmp>.tensors` beside it, and
    torch.save opened it with a plain open: another user of the directory replaced it with a
    symlink, the export wrote the file it named, and the rename published the symlink."""
    import os

    import portable_ckpt.convert._torch_export as export

    portable_ckpt.save_arrays(tmp_path / "root", {"w": np.arange(8, dtype=np.float32)}, step=1)
    victim = tmp_path / "precious"
    victim.write_bytes(b"keep me")
    real = export.open_staged

    def planted(tmp: str):  # type: ignore[no-untyped-def]
        os.unlink(tmp)
        os.symlink(victim, tmp)  # the attacker's race, won
        return real(tmp)

    monkeypatch.setattr(export, "open_staged", planted)
    out = tmp_path / "model.pt"
    with pytest.raises((OSError, CheckpointError)):
        convert(tmp_path / "root", out, dst_format="torch")
    assert victim.read_bytes() == b"keep me" and not os.path.lexists(out)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no staging left


def _read_npz_with_entry(src: str, options: ConvertOptions) -> SourcePlan:
    plan = _read_npz(src, options)
    plan.entries.append(_PLUGIN_ENTRY[0])
    return plan


_PLUGIN_ENTRY: list[EntrySpec] = []


@pytest.mark.parametrize(
    ("entry", "code"),
    [
        # a plugin's EntrySpec the writer refuses: the plugin's usage, not a damaged source
        (EntrySpec("meta", {"a": 1}, scope="per_rank"), "PCK-USAGE"),
        (EntrySpec("meta", {"a": 1}, scope="global", rank=0), "PCK-USAGE"),
        # a value JSON cannot hold: the source's content
        (EntrySpec("meta", {"a": float("nan")}), "PCK-UNSUPPORTED-VALUE"),
        (EntrySpec("meta", {"a": 10**5000}), "PCK-UNSUPPORTED-VALUE"),
    ],
)
def test_only_values_json_cannot_hold_are_the_sources_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: EntrySpec, code: str
) -> None:
    # review rev22 D4: every UsageError of add_entry was relabelled PCK-UNSUPPORTED-VALUE
    fmt = Format(
        name="npz", help="numpy .npz archives", reader=f"{__name__}:_read_npz_with_entry",
        detect=lambda p: p.endswith(".npz"),
    )
    monkeypatch.setitem(FORMATS, "npz", fmt)
    monkeypatch.setattr(sys.modules[__name__], "_PLUGIN_ENTRY", [entry])
    np.savez(tmp_path / "a.npz", w=np.arange(6.0))
    with pytest.raises(CheckpointError) as ei:
        convert(tmp_path / "a.npz", tmp_path / "root")
    assert ei.value.code == code, ei.value
    if code == "PCK-UNSUPPORTED-VALUE":
        assert "value 'a' (entry 'meta')" in str(ei.value)
        assert "set_int_max_str_digits" not in str(ei.value)
    else:
        assert "change or remove it in the source" not in str(ei.value)
    assert not (tmp_path / "root").exists()
