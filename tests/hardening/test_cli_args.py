"""Every CLI argument is checked before anything is touched (issue 12, items 21 and 22).

Usage errors exit 2 with one ``portable-ckpt: ...`` line and no traceback, before any file is
read or written; a root that does not exist is ``PCK-NOT-FOUND`` (exit 1), not "no attempts";
``inspect ... | head`` ends quietly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage

ROOT = Path(__file__).resolve().parents[2]


def _version(root: Path) -> str:
    m = portable_ckpt.save_arrays(root, {"w": np.arange(64, dtype=np.float32)}, step=1,
                                  entries={"cfg": {"a": 1}})
    return m.attempt_id


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for d, dirs, files in os.walk(root):
        for n in files + dirs:
            st = os.lstat(os.path.join(d, n))
            out[os.path.relpath(os.path.join(d, n), root)] = (st.st_size, st.st_mtime_ns)
    return out


def _usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as ei:
        cli_main(argv)
    err = capsys.readouterr().err
    assert ei.value.code == 2, (argv, err)
    assert "Traceback" not in err and "error:" in err, err
    return err


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["copy"], "not a directory"),
        # operator review: a rerun said "a destination root is a directory" for a torch target
        (["convert", "--to", "torch"], "a torch target is a new file"),
    ],
)
def test_a_destination_that_is_an_existing_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], says: str
) -> None:
    """Item 21: ``copy CKPT <file>`` printed a traceback; now exit 2, nothing written anywhere."""
    _version(tmp_path / "src")
    target = tmp_path / "a-file"
    target.write_bytes(b"keep me")
    before = _snapshot(tmp_path)
    assert says in _usage([*command, str(tmp_path / "src"), str(target)], capsys)
    assert _snapshot(tmp_path) == before and target.read_bytes() == b"keep me"


def test_copy_to_s3_without_a_bucket_never_writes_a_local_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 21: ``copy CKPT s3://`` exited 0 after copying into ./s3: — now a usage error."""
    _version(tmp_path / "src")
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    for dst in ("s3://", "s3:///prefix", "s3://?x=1", "gs://bucket/x"):
        _usage(["copy", str(tmp_path / "src"), dst], capsys)
    assert not (tmp_path / "s3:").exists() and _snapshot(tmp_path) == before
    from portable_ckpt.io.copy import copy_version

    with pytest.raises(portable_ckpt.UsageError):
        copy_version(str(tmp_path / "src"), "s3://")


@pytest.mark.parametrize("grace", ["nan", "-1", "inf", "-inf", "1e999", "x"])
def test_gc_grace_must_be_finite_and_non_negative(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], grace: str
) -> None:
    """Item 21: ``gc --grace nan`` / ``-1`` deleted a save started a second ago."""
    _version(tmp_path)
    storage = open_storage(tmp_path)
    w = ShardWriter(storage, new_attempt_id(2), 0)
    w.add_tensor("w", np.ones(4, np.float32))
    w.finish()  # a save in progress: data and index written, not committed yet
    before = _snapshot(tmp_path)
    _usage(["gc", str(tmp_path), "--keep", "1", f"--grace={grace}"], capsys)
    assert _snapshot(tmp_path) == before
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(portable_ckpt.UsageError):
            portable_ckpt.gc(tmp_path, keep=1, grace_seconds=bad)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("n", ["0", "-3", "100000000", "two"])
def test_drill_world_size_is_checked_before_any_process_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], n: str
) -> None:
    """Item 21: ``drill --world-size 0`` was a traceback, 100000000 started processes."""
    _version(tmp_path)
    before = _snapshot(tmp_path)
    _usage(["drill", str(tmp_path), "--world-size", n], capsys)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "s3://"],
        ["inspect", "{root}", "--step", "-1"],
        ["inspect", "{root}", "--step", "1000000000000"],
        ["verify", "{root}", "--sample", "0"],
        ["verify", "{root}", "--sample", "nan"],
        ["verify", "{root}", "--sample", "1.5"],
        ["verify", "{root}", "--step", "x"],
        ["gc", "{root}", "--keep", "0"],
        ["gc", "{root}", "--keep", "-1"],
        ["gc", "{root}", "--keep", "1", "--require-copy", "s3://"],
        ["copy", "{root}", "{root}-dst", "--jobs", "0"],
        ["copy", "{root}", "{root}-dst", "--chunk-mib", "0"],
        ["copy", "{root}", "{root}-dst", "--step", "-2"],
        ["drill", "{root}", "--world-size", "1", "--timeout", "0"],
        ["drill", "{root}", "--world-size", "1", "--timeout", "nan"],
        ["drill", "{root}", "--world-size", "1", "--factory", "no-colon"],
        ["demo", "--ranks", "0"],
        ["demo", "--resume-ranks", "100000"],
        ["demo", "--steps", "0"],
        ["demo", "--save-step", "12", "--steps", "12"],
        ["demo", "--hidden", "0"],
        ["convert", "{root}", "{root}-dst", "--step", "-1"],
        ["convert", "{root}", "{root}-dst", "--max-shard-size", "lots"],
        ["convert", "{root}", "{root}-dst", "--max-shard-size", "0"],
        # conversion review 25, H1: int(inf) was an OverflowError traceback, exit 1
        ["convert", "{root}", "{root}-dst", "--to", "hf", "--max-shard-size", "inf"],
        ["convert", "{root}", "{root}-dst", "--to", "hf", "--max-shard-size", "1e400"],
        ["convert", "{root}", "{root}-dst", "--to", "hf", "--max-shard-size", "nanGB"],
        ["convert", "{root}", "{root}-dst", "--max-output", "inf"],
        ["convert", "{root}", "{root}-dst", "--max-output", "1e30TiB"],
        ["convert", "{root}", "s3://"],
    ],
    ids=lambda a: " ".join(a)[:60],
)
def test_every_subcommand_checks_its_arguments_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """Item 21 audit: every bad value is exit 2 before anything is read or written."""
    root = tmp_path / "root"
    _version(root)
    argv = [a.format(root=root) for a in argv]
    before = _snapshot(tmp_path)
    _usage(argv, capsys)
    assert _snapshot(tmp_path) == before


def test_a_failing_argument_check_is_a_usage_error_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Conversion review 25, H1: argparse makes only ValueError and TypeError of a type check
    usage errors, and the CLI's guard began after parsing: any other exception of a check was
    a traceback. Now exit 2, nothing touched, the cause named."""
    import portable_ckpt.convert.hf as hf

    def overflow(text: str) -> int:
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(hf, "parse_size", overflow)
    root = tmp_path / "root"
    _version(root)
    before = _snapshot(tmp_path)
    assert cli_main(["convert", str(root), f"{root}-dst", "--max-shard-size", "5GB"]) == 2
    err = capsys.readouterr().err
    assert "cannot read the arguments" in err and "OverflowError" in err, err
    assert "Traceback" not in err and _snapshot(tmp_path) == before


def test_ls_and_gc_of_a_missing_root_say_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 22: a mistyped root was "no attempts" / "kept 0" with exit 0; now PCK-NOT-FOUND."""
    missing = tmp_path / "no-such-root"
    for argv in (["ls", str(missing)], ["ls", str(missing), "--json"],
                 ["gc", str(missing), "--keep", "1"]):
        assert cli_main(argv) == 1, argv
        err = capsys.readouterr().err
        assert "PCK-NOT-FOUND" in err and "does not exist" in err and "Traceback" not in err
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    assert cli_main(["ls", str(tmp_path / "empty")]) == 0  # an empty root exists
    assert "no attempts" in capsys.readouterr().out


def test_python_dash_m_runs_the_command(tmp_path: Path) -> None:
    """``python -m portable_ckpt`` is the ``portable-ckpt`` command (it was "cannot be directly
    executed"): same usage line, same exit codes."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    run = [sys.executable, "-m", "portable_ckpt"]
    p = subprocess.run([*run, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("usage: portable-ckpt"), p.stderr
    p = subprocess.run([*run, "ls", str(tmp_path / "none")], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 1 and "PCK-NOT-FOUND" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([*run, "ls"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_inspect_into_a_closed_pipe_prints_no_traceback(tmp_path: Path) -> None:
    """Item 22: ``inspect ... | head`` died with a BrokenPipeError traceback."""
    root = tmp_path / "root"
    arrays = {f"t{i:04d}": np.zeros(2, np.float32) for i in range(3000)}  # > a pipe buffer
    portable_ckpt.save_arrays(root, arrays, step=1)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cmd = (f"{sys.executable} -m portable_ckpt.cli.main inspect {root} --ranges | head -n 2; "
           "exit ${PIPESTATUS[0]}")
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, timeout=120)
    assert len(p.stdout.splitlines()) == 2
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
    assert p.returncode == 141, (p.returncode, p.stderr)  # 128 + SIGPIPE, as cat or grep


def test_a_version_directory_is_no_root_for_ls_gc_or_a_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Operator review: `ls`/`gc` of a version directory said "no attempts" with exit 0 (a
    script reads "no checkpoints"), and `copy` wrote a version inside another root's version."""
    ident = _version(tmp_path / "root")
    vdir = tmp_path / "root" / ident
    other = tmp_path / "other"
    dst_version = other / _version(other)
    link = tmp_path / "link"
    link.symlink_to(vdir)  # attack review: an alias of a version directory was taken for a root
    before = _snapshot(tmp_path)
    for argv in (["ls", str(vdir)], ["gc", str(vdir), "--keep", "1"],
                 ["ls", str(vdir / "data")], ["gc", str(vdir / "data"), "--keep", "1"],
                 ["ls", str(link)], ["gc", str(link), "--keep", "1"],
                 ["copy", str(vdir), str(dst_version)], ["copy", str(vdir), str(dst_version / "data")]):
        err = _usage(argv, capsys)
        assert "is a version directory" in err, err
    assert _snapshot(tmp_path) == before
    assert cli_main(["inspect", str(vdir)]) == 0  # a version directory is what inspect takes


def test_a_version_directory_of_another_step_is_not_found(tmp_path: Path) -> None:
    """Operator review: it was PCK-MANIFEST-MISSING, the code of a version never committed."""
    vdir = tmp_path / "root" / _version(tmp_path / "root")
    with pytest.raises(portable_ckpt.CheckpointError) as ei:
        portable_ckpt.open(vdir, step=5)
    assert ei.value.code == "PCK-NOT-FOUND" and "step 1, not 5" in ei.value.message



def test_ls_names_each_copy_destination_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Operator review: a copy run again adds a record each time; ls listed the root 2-4 times."""
    ident = _version(tmp_path / "root")
    for _ in range(3):
        assert cli_main(["copy", str(tmp_path / "root"), str(tmp_path / "backup")]) == 0
    capsys.readouterr()
    assert cli_main(["ls", str(tmp_path / "root")]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(ident))
    assert row.count("backup") == 1, row


def test_output_that_cannot_be_written_is_said_as_such(tmp_path: Path) -> None:
    """stdout on a full disk was "internal error ... a bug", exit 1, which reads as "problems
    found" for verify (attack review F12): it is exit 74, and says the command ran."""
    import subprocess
    import sys

    import numpy as np

    import portable_ckpt

    portable_ckpt.save_arrays(tmp_path / "r", {"w": np.arange(3.0)}, step=1)
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "portable_ckpt", "ls", str(tmp_path / "r")],
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 74, p.stderr
    assert "cannot write the output" in p.stderr and "internal error" not in p.stderr
    assert "Traceback" not in p.stderr


def _subcommands() -> dict[str, Any]:
    import argparse

    from portable_ckpt.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


#: What a subcommand needs besides its paths to run at all (a new one with a required option
#: is listed here, or this test fails: it then runs with no checks of its own).
_REQUIRED = {"drill": ["--world-size", "1"], "gc": ["--keep", "1"]}


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_subcommand_keeps_the_clis_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """Maintainer review M5: the lists above are kept by hand (they missed pin and unpin), so
    a new subcommand got no check at all. Every one found by the CLI: --help exits 0; its path
    arguments are typed by cli/_args.py; an unusable root is exit 2 before anything is
    touched; a missing root with --json is one JSON document with ok false."""
    import json

    from portable_ckpt.cli import _args as A

    sub = _subcommands()[name]
    with pytest.raises(SystemExit) as ei:
        cli_main([name, "--help"])
    assert ei.value.code == 0 and name in capsys.readouterr().out
    paths = [a for a in sub._actions if not a.option_strings]
    assert all(a.type in (A.root_url, A.root_only, A.new_root) for a in paths), [
        (a.dest, a.type) for a in paths]
    if not paths:
        return
    root = tmp_path / "root"
    _version(root)
    before = _snapshot(tmp_path)
    others = [str(tmp_path / f"new{i}") for i in range(len(paths) - 1)]
    _usage([name, "s3://", *others, *_REQUIRED.get(name, [])], capsys)  # no bucket
    assert _snapshot(tmp_path) == before
    if "--json" in sub._option_string_actions:
        code = cli_main([name, str(tmp_path / "missing"), *others, *_REQUIRED.get(name, []),
                         "--json"])
        out = capsys.readouterr().out
        assert code == 1, (code, out)
        assert json.loads(out)["ok"] is False, out


@pytest.mark.parametrize(("exc", "code", "says"), [
    (OSError(28, "No space left on device", "/data/out.pt"), "PCK-STORAGE",
     "No space left on device at '/data/out.pt' (errno 28)"),
    (OSError(1, "Operation not permitted"), "PCK-INTERNAL", "internal error"),
    (MemoryError(), "PCK-OUT-OF-MEMORY", "out of memory"),
    (RuntimeError("boom"), "PCK-INTERNAL", "internal error (RuntimeError: boom)"),
])
def test_an_error_from_inside_a_library_is_said_for_what_it_is(
    capsys: pytest.CaptureFixture[str], exc: BaseException, code: str, says: str
) -> None:
    """Resource review R1, R9: a full disk inside torch.save's writer, or out of memory, was
    "internal error ... a bug of portable-ckpt" with no file named, and --json left stdout
    empty. Now the limit and the file are named, and --json prints one document."""
    import argparse
    import json

    from portable_ckpt.cli.main import _run

    def fails(args: argparse.Namespace) -> int:
        raise exc

    # A storage error is EX_TEMPFAIL (75: not damage, retry), everything else 1 (review F6).
    expected = 75 if code == "PCK-STORAGE" else 1
    assert _run(argparse.Namespace(func=fails, json=True, command="convert")) == expected
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc == {"ok": False, "error": {"code": code, "message": doc["error"]["message"],
                                          "retryable": expected == 75}}
    says = says.replace("internal error", "error in tests")  # raised by this package (B6)
    assert says in doc["error"]["message"] and says in err, err
    assert ("error in tests" in err) == (code == "PCK-INTERNAL")


def test_main_gives_the_callers_signal_handlers_back(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Diff review D1: main() left SIGINT ignored in the calling process (a test, a tool that
    calls it), whose later process groups then started with Ctrl-C ignored."""
    import signal

    _version(tmp_path)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    assert cli_main(["ls", str(tmp_path)]) == 0
    assert cli_main(["ls", str(tmp_path / "missing")]) == 1
    capsys.readouterr()
    assert {s: signal.getsignal(s) for s in before} == before


def test_ls_latest_that_could_not_read_is_retry_whatever_raised_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Last review L1: an OSError from inside a library under `ls --latest` was exit 1, read by
    scripts as "no version"; it is 75 (retry), as a StorageError is."""
    import argparse

    from portable_ckpt.cli.main import EXIT_RETRY, _run

    def fails(args: argparse.Namespace) -> int:
        raise OSError(5, "Input/output error", "/x/root/a/manifest.json")

    assert _run(argparse.Namespace(func=fails, latest=True, command="ls")) == EXIT_RETRY
    assert "while reading or writing" in capsys.readouterr().err
