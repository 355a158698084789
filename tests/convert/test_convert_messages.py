"""What a conversion user sees at the edges: names kept, destinations refused, sources named.

Each case is a finding of the conversion / S3 review (review 6): HF names with ``/``, the HF
metadata in a torch target, URL destinations of local-only formats, errors naming a removed
temporary version, and refusals that named a cause the source did not have.
"""

# ruff: noqa: E402
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from safetensors import safe_open
from safetensors.torch import save_file

import portable_ckpt
from portable_ckpt.convert import convert
from portable_ckpt.errors import CheckpointError

pytestmark = pytest.mark.torch


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "portable_ckpt.cli.main", *args],
        capture_output=True, text=True, cwd=cwd, timeout=120,
    )


@pytest.fixture
def hf_dir(tmp_path: Path) -> Path:
    d = tmp_path / "hf"
    d.mkdir()
    save_file(
        {"encoder/layer.w": torch.ones(2), "a~1b": torch.zeros(1), "b": torch.arange(3.0)},
        str(d / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return d


def _names(path: Path) -> list[str]:
    with safe_open(str(path), "pt") as f:
        return sorted(f.keys())


def test_hf_names_with_slash_and_tilde_survive_every_route(hf_dir: Path, tmp_path: Path) -> None:
    """An HF name is one key component: ``/`` and ``~`` in it come back unchanged."""
    names = ["a~1b", "b", "encoder/layer.w"]
    report = convert(hf_dir, tmp_path / "direct", dst_format="hf", strict=True)
    assert report.warnings == [] and _names(tmp_path / "direct" / "model.safetensors") == names
    convert(hf_dir, tmp_path / "root", step=1)
    assert sorted(portable_ckpt.open(str(tmp_path / "root")).tensors) == [
        "a~01b", "b", "encoder~1layer.w"
    ]
    convert(tmp_path / "root", tmp_path / "back", dst_format="hf")
    assert _names(tmp_path / "back" / "model.safetensors") == names
    convert(tmp_path / "root", tmp_path / "d", dst_format="dcp")
    convert(tmp_path / "d", tmp_path / "root2", trust_pickle=True, step=2)
    assert sorted(portable_ckpt.open(str(tmp_path / "root2")).tensors) == [
        "a~01b", "b", "encoder~1layer.w"
    ]


def test_hf_to_torch_is_a_state_dict_load_state_dict_takes(tmp_path: Path) -> None:
    """The safetensors ``__metadata__`` of the source is no key of a torch target."""
    model = torch.nn.Linear(3, 2)
    (tmp_path / "hf").mkdir()
    save_file(model.state_dict(), str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    convert(tmp_path / "hf", tmp_path / "m.pt", dst_format="torch")
    sd = torch.load(tmp_path / "m.pt", weights_only=True)
    assert sorted(sd) == ["bias", "weight"]
    other = torch.nn.Linear(3, 2)
    other.load_state_dict(sd)  # strict: an extra key would raise
    assert torch.equal(other.weight, model.weight)
    # the metadata is still written back to an HF target
    convert(tmp_path / "hf", tmp_path / "hf2", dst_format="hf")
    with safe_open(str(tmp_path / "hf2" / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}


@pytest.mark.parametrize(
    ("dst", "fmt"), [("s3://bucket/x.pt", "torch"), ("s3://bucket/hf", "hf"), ("s3://bucket/d", "dcp")]
)
def test_url_destination_of_a_local_format_is_a_usage_error(
    hf_dir: Path, tmp_path: Path, dst: str, fmt: str
) -> None:
    """It wrote a local directory named ``s3:`` and exited 0."""
    proc = _cli("convert", str(hf_dir), dst, "--to", fmt, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"a {fmt} destination is a local path (s3:// is for portable roots)" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "s3:").exists()


def test_url_source_of_a_local_format_is_a_usage_error(tmp_path: Path) -> None:
    """An HF source on S3 was reported as "does not exist"."""
    with pytest.raises(CheckpointError) as ei:
        convert("s3://bucket/hfsrc", tmp_path / "root", src_format="hf")
    assert ei.value.code == "PCK-USAGE" and "hf source is a local path" in ei.value.message
    assert not (tmp_path / "root").exists()


def test_two_step_error_names_the_source_not_the_removed_temporary(tmp_path: Path) -> None:
    """A ``.pt`` with no tensor, to HF: the error named the ``.pck-convert-*`` version."""
    src = tmp_path / "values.pt"
    torch.save({"epoch": 3, "lr": [0.1, 0.2]}, src)
    proc = _cli("convert", str(src), "out", "--to", "hf", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "[PCK-TENSOR-MISSING]" in proc.stderr and str(src) in proc.stderr
    assert ".pck-convert-" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["values.pt"]


def test_source_key_over_the_limit_is_the_sources_problem(tmp_path: Path) -> None:
    """Exit 1 with a short message (it was exit 2, quoting all 5,000 characters)."""
    src = tmp_path / "long.pt"
    torch.save({"model": {"x" * 5000: torch.ones(1)}}, src)
    proc = _cli("convert", str(src), "root", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "[PCK-UNSUPPORTED-VALUE]" in proc.stderr and "5,006 characters" in proc.stderr
    assert len(proc.stderr) < 400
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").iterdir())


def test_max_output_refusal_names_the_bound_it_used(tmp_path: Path) -> None:
    """An explicit ``--max-output`` is the cause; aliasing is named only for the default bound."""
    src = tmp_path / "big.pt"
    torch.save({"big": torch.zeros(1000, 1000)}, src)
    proc = _cli("convert", str(src), "root", "--max-output", "1MB", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "[PCK-LIMIT]" in proc.stderr and "--max-output / max_output_bytes bound" in proc.stderr
    assert "alias" not in proc.stderr


def test_refused_convert_prints_its_error_once(hf_dir: Path, tmp_path: Path) -> None:
    """The library's log line and the CLI's error said the same thing twice."""
    proc = _cli("convert", str(hf_dir), "s3://bucket/hf", "--to", "hf", cwd=tmp_path)
    assert proc.stderr.count("s3:// is for portable roots") == 1, proc.stderr
    src = tmp_path / "values.pt"
    torch.save({"epoch": 3}, src)
    proc = _cli("convert", str(src), "out", "--to", "hf", cwd=tmp_path)
    assert proc.stderr.count("has no tensor to export") == 1, proc.stderr


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("kind", ["legacy", "plain"])
def test_pickle_that_would_run_code_is_refused_as_a_value_not_a_header(kind: str, tmp_path: Path) -> None:
    """The refusal said PCK-SHARD-HEADER and quoted torch's advice to unpickle with code."""
    import pickle

    marker = str(tmp_path / "ran")
    src = tmp_path / f"{kind}.pt"
    if kind == "legacy":
        torch.save({"a": _Payload(marker)}, src, _use_new_zipfile_serialization=False)
    else:
        with open(src, "wb") as f:
            pickle.dump({"a": _Payload(marker)}, f, protocol=4)
    proc = _cli("convert", str(src), "root", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    if kind == "legacy":  # refused as a format (stop 23: torch's legacy loader is not safe)
        assert "[PCK-UNSUPPORTED-VALUE]" in proc.stderr and "a legacy (pre-1.6" in proc.stderr
    else:  # a plain pickle is no torch.save file: refused before torch sees it
        assert "[PCK-SHARD-HEADER]" in proc.stderr and "not a torch.save file" in proc.stderr
    assert "weights_only` set to `False`" not in proc.stderr and "Detected pickle" not in proc.stderr
    assert not os.path.exists(marker)


def test_deep_key_to_torch_is_refused_not_a_recursion_error(tmp_path: Path) -> None:
    """Attack review: a 512-level key (a valid key) crashed ``--to torch`` with RecursionError.

    torch.save itself cannot pickle such nesting; verbatim keys give a flat dict.
    """
    import numpy as np

    key = "/".join(["a"] * 512)
    portable_ckpt.save_arrays(tmp_path / "root", {key: np.ones(2, np.float32)}, step=1)
    proc = _cli("convert", "root", "deep.pt", "--to", "torch", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "[PCK-UNSUPPORTED-VALUE]" in proc.stderr and "nests 512 levels" in proc.stderr
    assert not (tmp_path / "deep.pt").exists()
    convert(tmp_path / "root", tmp_path / "flat.pt", dst_format="torch", keys="verbatim")
    assert list(torch.load(tmp_path / "flat.pt", weights_only=True)) == [key]


def test_strip_prefix_collisions_of_values_are_refused(tmp_path: Path) -> None:
    """Attack review: a value stripped onto another value's (or a tensor's) name was dropped."""
    import portable_ckpt.torch as pckt

    pckt.save({"model": {"w": torch.ones(2), "lr": 0.5}, "lr": 0.001, "w": 7}, tmp_path / "src", step=1)
    for to, dst in (("torch", "d.pt"), ("dcp", "d")):
        proc = _cli("convert", "src", dst, "--to", to, "--strip-prefix", "model/", cwd=tmp_path)
        assert proc.returncode == 2, (to, proc.stderr)
        assert "are both exported as" in proc.stderr, proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_recorded_list_with_holes_comes_back_a_list(tmp_path: Path) -> None:
    """Attack review: a recorded list whose first positions hold nothing became ``{40: ...}``.

    Positions nothing was stored at are None, as DCP's own loader leaves them.
    """
    import torch.distributed.checkpoint as dcp

    from portable_ckpt.format.keys import LIST_ROOM
    from portable_ckpt.torch.dcp import PortableStorageWriter

    for n in (9, 40, LIST_ROOM + 40):
        state = {"l": [{} for _ in range(n)] + [{"a": 1}], "w": torch.ones(2)}
        root = tmp_path / f"root{n}"
        dcp.save(state, storage_writer=PortableStorageWriter(str(root), step=1), no_dist=True)
        if n > LIST_ROOM:  # past the room the DCP reader gives a record's lists: refused
            with pytest.raises(CheckpointError) as ei:
                convert(root, tmp_path / f"s{n}.pt", dst_format="torch")
            assert ei.value.code == "PCK-UNSUPPORTED-VALUE" and f"position {n}" in ei.value.message
            continue
        convert(root, tmp_path / f"s{n}.pt", dst_format="torch")
        out = torch.load(tmp_path / f"s{n}.pt", weights_only=True)
        assert out["l"] == [None] * n + [{"a": 1}]
        assert torch.equal(out["w"], torch.ones(2))


@pytest.mark.parametrize("exc", [
    OSError(28, "No space left on device"),
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),
])
def test_a_full_disk_inside_torch_save_is_a_storage_error_naming_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    """Resource review R1: a full disk met inside torch.save's zip writer (an OSError naming no
    file, or "unexpected pos") reached the CLI as "internal error ... a bug"."""
    import numpy as np

    from portable_ckpt.errors import StorageError

    portable_ckpt.save_arrays(tmp_path / "src", {"w": np.ones(4, np.float32)}, step=1)

    def full(*args: object, **kwargs: object) -> None:
        raise exc

    monkeypatch.setattr(torch, "save", full)
    dst = tmp_path / "out.pt"
    with pytest.raises(StorageError, match="nothing was published") as err:
        convert(str(tmp_path / "src"), str(dst), dst_format="torch")
    assert str(dst) in str(err.value) and "twice its size" in str(err.value)
    assert not dst.exists() and [p.name for p in tmp_path.iterdir()] == ["src"]


def test_keys_with_one_dcp_name_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Odd-states review O10: a version holding `a.b` and `a/b` converted to DCP with both
    skipped: "0 tensors", exit 0. Refused now, naming the keys and the fixes."""
    import numpy as np

    from portable_ckpt.errors import UsageError

    portable_ckpt.save_arrays(tmp_path / "src", {"a.b": np.ones(2, np.float32),
                                                 "a/b": np.zeros(2, np.float32)}, step=1)
    with pytest.raises(UsageError, match=r"keys \['a.b', 'a/b'\] have the same DCP name"):
        convert(str(tmp_path / "src"), str(tmp_path / "dcp"), dst_format="dcp")
    assert not (tmp_path / "dcp").exists()
    res = convert(str(tmp_path / "src"), str(tmp_path / "dcp2"), dst_format="dcp",
                  keys="verbatim")
    assert res.tensors == 2


# -- attack review of the conversion tooling (M1, M3, M4, M5, L1, L3) -------------------------------


def _edit_pickle(src: Path, dst: Path, edit: object) -> None:
    """Copy the torch.save zip ``src`` with its ``data.pkl`` passed through ``edit``."""
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, edit(data) if info.filename.endswith("/data.pkl") else data)  # type: ignore[operator]


def test_hostile_values_are_the_sources_problem_naming_the_file_and_key(tmp_path: Path) -> None:
    torch.save({"w": torch.arange(4.0), "epoch": 1}, tmp_path / "ok.pt")
    # an int of 5000 digits (LONG4) where the file had 1
    huge = (10**5000).to_bytes(2100, "little", signed=True)
    big = tmp_path / "big.pt"
    long4 = b"\x8b" + len(huge).to_bytes(4, "little") + huge

    def edit(d: bytes) -> bytes:
        at = d.index(b"epoch")
        assert d[at + 7 : at + 9] == b"K\x01"  # epoch, BINPUT, BININT1 1
        return d[: at + 7] + long4 + d[at + 9 :]

    _edit_pickle(tmp_path / "ok.pt", big, edit)
    r = _cli("convert", str(big), str(tmp_path / "o1"), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "PCK-UNSUPPORTED-VALUE" in r.stderr and str(big) in r.stderr and "'epoch'" in r.stderr
    assert "set_int_max_str_digits" not in r.stderr and "Traceback" not in r.stderr
    # a tensor name with a lone surrogate (not UTF-8)
    bad = tmp_path / "surrogate.pt"
    _edit_pickle(tmp_path / "ok.pt", bad, lambda d: d.replace(b"X\x01\x00\x00\x00w", b"X\x04\x00\x00\x00w\xed\xb0\x80"))
    r = _cli("convert", str(bad), str(tmp_path / "o2"), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "PCK-UNSUPPORTED-VALUE" in r.stderr and str(bad) in r.stderr and "rename it" in r.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


@pytest.mark.parametrize(
    ("state", "extra"),
    [
        ({1: "A", "1": "B"}, ()),
        ({"": "A", "value": "B"}, ()),
        ({"a": {"b": "A"}, "a.b": "B"}, ("--keys", "verbatim")),
    ],
    ids=["int-and-str", "empty-and-value", "verbatim-dots"],
)
def test_torch_keys_that_collide_are_refused_naming_both(
    state: dict[object, object], extra: tuple[str, ...], tmp_path: Path
) -> None:
    def fill(node: object) -> object:
        if isinstance(node, dict):
            return {k: fill(v) for k, v in node.items()}
        return torch.full((4,), 1.0 if node == "A" else 2.0)

    torch.save(fill(state), tmp_path / "src.pt")
    r = _cli("convert", str(tmp_path / "src.pt"), str(tmp_path / "out"), *extra, cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # the source's content: exit 1, not a usage error (rev22 D3)
    assert "PCK-UNSUPPORTED-VALUE" in r.stderr and str(tmp_path / "src.pt") in r.stderr
    assert "both become the key" in r.stderr and "COVERAGE" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_torch_target_below_a_file_and_a_symlinked_dst_are_refused_up_front(
    hf_dir: Path, tmp_path: Path
) -> None:
    src = hf_dir / "model.safetensors"
    r = _cli("convert", str(src), str(src / "x.pt"), "--to", "torch", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "is not a directory" in r.stderr and "internal error" not in r.stderr
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    for to in ("hf", "dcp"):
        r = _cli("convert", str(src), str(tmp_path / "link"), "--to", to, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert "symbolic link" in r.stderr and "PCK-STORAGE" not in r.stderr
    assert (tmp_path / "link").is_symlink() and not os.listdir(tmp_path / "empty")
    r = _cli("convert", str(src), str(hf_dir), "--to", "hf", cwd=tmp_path)
    assert r.returncode == 2 and "already is not" not in r.stderr and "is not empty" in r.stderr


def test_a_huge_dimension_is_shortened_and_names_the_file(tmp_path: Path) -> None:
    torch.save({"w": torch.zeros(0, 2)}, tmp_path / "ok.pt")
    src = tmp_path / "huge.pt"
    # size (0, 2) -> (0, 2**1000): zero elements, so the storage check passes
    n = (2**1000).to_bytes(127, "little", signed=True)
    _edit_pickle(tmp_path / "ok.pt", src, lambda d: d.replace(b"K\x00K\x02\x86", b"K\x00\x8a\x7f" + n + b"\x86", 1))
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out")
    msg = str(ei.value)
    assert ei.value.code == "PCK-LIMIT" and str(src) in msg and "(302 digits)" in msg
    assert len(msg) < 400 and "chunks stored in )" not in msg


def test_a_cyclic_list_is_skipped_not_copied(tmp_path: Path) -> None:
    x: list[object] = [torch.arange(4.0)]
    x.append(x)
    torch.save({"a": x}, tmp_path / "cyc.pt")
    report = convert(tmp_path / "cyc.pt", tmp_path / "out", drop_unsupported=True)
    assert report.tensors == 1  # a/0 once, not 63 copies down to the depth cap
    assert any("cycle" in w.message for w in report.warnings)
    with pytest.raises(CheckpointError, match="cycle"):
        convert(tmp_path / "cyc.pt", tmp_path / "strict", strict=True)


def test_the_walk_of_a_torch_file_stops_64_containers_deep(tmp_path: Path) -> None:
    """mutation audit 22 B2-28: the walk of a torch.save value descends 64 containers at most:
    a tensor in a list nested 70 deep is skipped with a warning naming the item at depth 64
    (nothing converted), one nested 60 deep converts. Without the bound the walk went on to
    the deep tensor (and only Python's recursion limit ended deeper ones)."""
    for depth, want in ((60, 1), (70, 0)):
        deep: object = torch.ones(2)
        for _ in range(depth):
            deep = [deep]
        src = tmp_path / f"deep{depth}.pt"
        torch.save({"d": deep}, src)
        report = convert(src, tmp_path / f"out{depth}", drop_unsupported=True)
        assert report.tensors == want
        if want:
            key = "d" + "/0" * depth
            assert portable_ckpt.open(str(tmp_path / f"out{depth}")).read(key).tolist() == [1.0, 1.0]
        else:
            assert [w.item for w in report.warnings] == ["d" + "/0" * 63]


@pytest.mark.parametrize("value", [{1, 2}, 3 + 4j, b"raw"])
def test_strict_refuses_a_torch_value_it_would_skip_as_unsupported_value(tmp_path: Path,
                                                                          value: Any) -> None:
    """docs/convert.md, ``--strict``: a strict refusal is PCK-UNSUPPORTED-VALUE naming the item
    (a torch.save value that is no JSON was PCK-SHARD-HEADER, as if the file were damaged;
    mutation audit 22 B2-23 found the two codes); without --strict it is skipped."""
    import torch

    src = tmp_path / "src.pt"
    torch.save({"w": torch.arange(4.0), "odd": value}, src)
    with pytest.raises(CheckpointError) as ei:
        convert(str(src), str(tmp_path / "out"), strict=True)
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE" and "'odd'" in ei.value.message
    assert not (tmp_path / "out").exists()
    report = convert(str(src), str(tmp_path / "out2"), drop_unsupported=True)
    assert any("odd" in f"{w.item} {w.message}" for w in report.warnings), report.warnings


def test_strict_names_every_torch_value_it_would_skip_in_one_refusal(tmp_path: Path) -> None:
    """``--strict`` on a torch.save file with several values that are no JSON names them all
    in one refusal, the sixth and later counted (left open by stop 26: it stopped at the first,
    a fix-and-retry loop per item); the cycle is among them. Nothing is written."""
    import torch

    cyc: list[object] = [torch.arange(2.0)]
    cyc.append(cyc)
    src = tmp_path / "src.pt"
    torch.save({"w": torch.arange(4.0), "a": {1, 2}, "b": 3 + 4j, "c": b"raw", "cyc": cyc,
                "d": {"e": {5}}, "f": frozenset({1}), "g": 1.5}, src)
    with pytest.raises(CheckpointError) as ei:
        convert(str(src), str(tmp_path / "out"), strict=True)
    msg = ei.value.message
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE" and str(src) in msg
    assert "6 item(s) are not convertible" in msg and "(and 1 more)" in msg, msg
    assert all(f"item {k}: " in msg for k in ("'a'", "'b'", "'c'", "'cyc/1'", "'d'")), msg
    assert not (tmp_path / "out").exists()
    r = _cli("convert", str(src), str(tmp_path / "out"), "--strict", cwd=tmp_path)
    assert r.returncode == 1 and "6 item(s)" in r.stderr and "Traceback" not in r.stderr


def test_two_equal_keys_of_one_dict_are_refused_not_both_converted(tmp_path: Path) -> None:
    """Re-attack of rev22, R2: a data.pkl edited to hold {2**70: {"a": t0}, 2**70: {"b": t1}}
    (torch.load keeps only the last) converted into both tensors, exit 0: the scan keeps keys
    whose hash the file could choose apart. Two keys of one dict that become one key are
    refused, naming both (also 1 and "1" above tensors)."""
    import pickle
    import zipfile

    import torch

    big = 1 << 70
    torch.save({big: {"a": torch.zeros(2)}, big + 1: {"b": torch.ones(2)}}, tmp_path / "h.pt")
    with zipfile.ZipFile(tmp_path / "h.pt") as z:
        names = z.namelist()
        pkl = next(n for n in names if n.endswith("data.pkl"))
        data = z.read(pkl).replace(pickle.dumps(big + 1, 2)[2:-1], pickle.dumps(big, 2)[2:-1])
        with zipfile.ZipFile(tmp_path / "dup.pt", "w", zipfile.ZIP_STORED) as w:
            for n in names:
                w.writestr(n, data if n == pkl else z.read(n))
    assert list(torch.load(tmp_path / "dup.pt", weights_only=True)[big]) == ["b"]
    with pytest.raises(CheckpointError) as ei:
        convert(str(tmp_path / "dup.pt"), str(tmp_path / "out.pt"), dst_format="torch")
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE" and str(big) in ei.value.message
    assert not (tmp_path / "out.pt").exists()
    torch.save({1: {"a": torch.zeros(2)}, "1": {"b": torch.ones(2)}}, tmp_path / "m.pt")
    with pytest.raises(CheckpointError, match=r"keys at \[1\] and \['1'\]"):
        convert(str(tmp_path / "m.pt"), str(tmp_path / "out2.pt"), dst_format="torch")


# Conversion review 25: the smaller findings (L1-L6).


def _portable(tmp_path: Path, step: int = 1) -> Path:
    root = tmp_path / "root"
    save_file({"w": torch.arange(8.0)}, str(tmp_path / "m.safetensors"))
    convert(tmp_path / "m.safetensors", root, step=step)
    return root


@pytest.mark.parametrize("target", ["hf", "dcp", "torch"])
def test_max_output_bounds_an_export(tmp_path: Path, target: str) -> None:
    """L1: ``--max-output 10`` wrote every byte of an export (it bounded imports only)."""
    root = _portable(tmp_path)
    dst = tmp_path / ("out.pt" if target == "torch" else "out")
    with pytest.raises(CheckpointError) as ei:
        convert(root, dst, dst_format=target, max_output_bytes=10)
    assert ei.value.code == "PCK-LIMIT" and "32 bytes" in str(ei.value), ei.value
    assert not dst.exists()
    convert(root, dst, dst_format=target, max_output_bytes=32)
    assert dst.exists()


def test_a_step_above_the_format_s_largest_is_named_before_the_root_is_made(
    tmp_path: Path,
) -> None:
    """L2: a millisecond timestamp as ``global_step`` was a bare "step must be an int in ...",
    exit 2 after an empty destination root was made."""
    src = tmp_path / "ts.pt"
    torch.save({"w": torch.ones(2), "global_step": 1733430000000}, src)
    p = _cli("convert", str(src), "root", cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "'global_step' value is 1,733,430,000,000" in p.stderr and "--step" in p.stderr
    assert not (tmp_path / "root").exists()
    assert _cli("convert", str(src), "root", "--step", "7", cwd=tmp_path).returncode == 0


def test_shards_whose_metadata_differ_are_said_and_refused_under_strict(tmp_path: Path) -> None:
    """L3: each shard's ``__metadata__`` was merged without a word, the first value winning,
    also under ``--strict``."""
    import json

    src = tmp_path / "src"
    src.mkdir()
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    save_file({"a": torch.ones(2)}, str(src / names[0]), metadata={"format": "pt", "k": "1"})
    save_file({"b": torch.ones(2)}, str(src / names[1]), metadata={"format": "pt", "k": "2"})
    (src / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": names[0], "b": names[1]}}))
    with pytest.raises(CheckpointError, match=r"__metadata__\['k'\]: differs") as ei:
        convert(src, tmp_path / "strict", strict=True)
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE" and "'format'" not in str(ei.value)
    report = convert(src, tmp_path / "root")
    assert [w.item for w in report.warnings] == [f"{src / names[1]}: __metadata__['k']"]


def test_destinations_that_cannot_work_are_usage_errors_first(tmp_path: Path) -> None:
    """L4, L5: a torch target ``new.pt/`` ran the whole export and then failed to rename (exit
    1); a portable root below a file was exit 1; ``convert hf hf`` committed a version among
    the model's files (exit 0)."""
    root = _portable(tmp_path)
    (tmp_path / "afile").write_text("x")
    hf = tmp_path / "hf"
    hf.mkdir()
    save_file({"w": torch.ones(2)}, str(hf / "model.safetensors"))
    for args in (["convert", str(root), "new.pt/", "--to", "torch"],
                 ["convert", str(hf), "afile/root"],
                 ["convert", str(hf), "hf"],
                 ["convert", str(hf), "hf/sub"],
                 ["convert", str(root), "root/inner", "--step", "1"]):
        before = sorted(p.name for p in tmp_path.rglob("*"))
        p = _cli(*args, cwd=tmp_path)
        assert p.returncode == 2 and "PCK-USAGE" in p.stderr, (args, p.stderr)
        assert sorted(p.name for p in tmp_path.rglob("*")) == before, args
    assert _cli("convert", str(hf), "hf2", cwd=tmp_path).returncode == 0


def test_an_import_below_the_root_s_latest_step_is_said(tmp_path: Path) -> None:
    """L6: an import at step 3 into a root whose latest is step 500 said nothing: readers keep
    step 500, and ``gc --retire-abandoned`` takes it for a rollback's abandoned branch."""
    root = _portable(tmp_path, step=500)
    report = convert(tmp_path / "m.safetensors", root, step=3)
    (note,) = [w for w in report.warnings if w.kind == "note"]
    assert "below the root's latest version, step 500" in note.message
    assert "--retire-abandoned" in note.message
    assert not [w for w in convert(tmp_path / "m.safetensors", root, step=600).warnings
                if w.kind == "note"]
