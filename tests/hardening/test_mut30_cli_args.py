"""Mutation audit 30, the CLI's argument types (``cli/_args.py``): the documented bounds are inclusive.

``test_cli_args`` checks values outside each range; a bound moved by one inward (``<`` for
``<=``) refused a documented value and went unseen. Parsed by the CLI's own parser, with no
root needed: nothing runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from portable_ckpt.cli.main import build_parser


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as ei:
        _parse(argv)
    assert ei.value.code == 2
    return capsys.readouterr().err


def test_every_documented_bound_is_accepted(tmp_path: Path) -> None:
    """Mutants a01, a02, a03, a04, a05, a06: each range's ends are values a user may give."""
    r, d = str(tmp_path / "r"), str(tmp_path / "d")
    a = _parse(["copy", r, d, "--jobs", "256", "--chunk-mib", "4096", "--step", "999999999999"])
    assert (a.jobs, a.chunk_mib, a.step) == (256, 4096, 999_999_999_999)
    a = _parse(["copy", r, d, "--jobs", "1", "--chunk-mib", "1", "--step", "0"])
    assert (a.jobs, a.chunk_mib, a.step) == (1, 1, 0)
    a = _parse(["gc", r, "--keep", "1", "--grace", "0"])
    assert (a.keep, a.grace) == (1, 0.0)
    assert _parse(["verify", r, "--sample", "1"]).sample == 1.0
    assert _parse(["drill", r, "--world-size", "256", "--timeout", "0.001"]).world_size == 256
    assert _parse(["drill", r, "--world-size", "1"]).world_size == 1
    a = _parse(["pin", r, "--reason", "x" * 1024, "--by", "y" * 256])
    assert (len(a.reason), len(a.by)) == (1024, 256)
    assert _parse(["recommit", f"{r}/a", "--world-size", str(1 << 20)]).world_size == 1 << 20


@pytest.mark.parametrize(("argv", "says"), [
    (["copy", "{r}", "{d}", "--jobs", "257"], "jobs must be between 1 and 256"),
    (["copy", "{r}", "{d}", "--chunk-mib", "4097"], "chunk-mib must be between 1 and 4096"),
    (["drill", "{r}", "--world-size", "257"], "world-size must be between 1 and 256"),
    (["pin", "{r}", "--reason", "x" * 1025], "reason must be at most 1024 characters"),
    (["pin", "{r}", "--by", "y" * 257], "by must be at most 256 characters"),
    (["recommit", "{r}/a", "--world-size", str((1 << 20) + 1)], "world size must be between"),
    (["drill", "{r}", "--world-size", "1", "--timeout=-0"], "timeout must be > 0"),
    (["gc", "{r}", "--keep", "1", "--grace=-1e-9"], "grace must be >= 0"),
    # a factory is MODULE:FUNCTION exactly: anything after the name is no function's name
    (["drill", "{r}", "--world-size", "1", "--factory", "m.sub:fn()"], "MODULE:FUNCTION"),
    (["drill", "{r}", "--world-size", "1", "--factory", "m:fn;x"], "MODULE:FUNCTION"),
])
def test_one_past_each_bound_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        argv: list[str], says: str) -> None:
    """Mutants c09, c10, p04, a11 and the bounds above: one past is exit 2, the bound named."""
    argv = [a.format(r=tmp_path / "r", d=tmp_path / "d") for a in argv]
    assert says in _refused(argv, capsys)
    assert not (tmp_path / "r").exists() and not (tmp_path / "d").exists()


def test_a_factory_of_a_dotted_module_is_accepted(tmp_path: Path) -> None:
    a = _parse(["drill", str(tmp_path), "--world-size", "1", "--factory", "pkg.mod_1:make_2"])
    assert a.factory == "pkg.mod_1:make_2"


def test_record_unreadable_needs_a_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mutant v02: ``--record-unreadable`` records a failed verification: with ``--no-record``
    it can record nothing, a usage error (2) before anything is read, not a run that did not
    do what was asked."""
    import numpy as np

    import portable_ckpt
    from portable_ckpt.cli.main import main as cli_main

    aid = portable_ckpt.save_arrays(tmp_path, {"w": np.arange(4.0)}, step=1).attempt_id
    assert cli_main(["verify", str(tmp_path / aid), "--deep", "--no-record",
                     "--record-unreadable"]) == 2
    assert "--record-unreadable needs --deep (and a record: not --no-record)" in (
        capsys.readouterr().err)
    assert not (tmp_path / aid / "verifications").exists()
