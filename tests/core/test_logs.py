"""The job log (``portable_ckpt`` loggers) and the checksum messages, with real handlers and files.

No caplog: a plain ``logging.Handler`` on the package logger collects the records that a job's
own handler would get. The CLI runs in-process through ``main()`` (its own handler), "quiet by
default" in a fresh interpreter.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main
from portable_ckpt.errors import ChecksumError, WriterMissingError
from portable_ckpt.format.manifest import FORMAT_VERSIONS
from portable_ckpt.io.commit import commit
from portable_ckpt.io.copy import copy_version
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.logs import LOGGER_NAME, mib_per_s
from portable_ckpt.storage import open_storage
from portable_ckpt.testing.logs import EventLog, job_log
from tests._corrupt import flip_byte


@pytest.fixture(name="job_log")
def _job_log() -> Iterator[EventLog]:
    with job_log() as log:
        yield log


def _arrays() -> dict[str, np.ndarray]:
    return {
        "model/a": np.arange(3000, dtype=np.float32).reshape(30, 100),
        "model/b": np.ones(5000, np.float32),
    }


def test_commit_finished_reports_bytes_seconds_throughput(tmp_path, job_log: EventLog) -> None:
    m = portable_ckpt.save_arrays(tmp_path / "ck", _arrays(), step=3)
    (started,) = job_log.events("commit.started")
    (done,) = job_log.events("commit.finished")
    assert started["step"] == done["step"] == 3 and done["attempt_id"] == m.attempt_id
    assert done["bytes"] == sum(f.size for f in m.files.values()) > 24_000
    assert done["seconds"] > 0 and done["mib_per_s"] == mib_per_s(done["bytes"], done["seconds"])
    rec = job_log.record("commit.finished")
    assert rec.name == "portable_ckpt.io" and rec.levelno == logging.INFO
    assert "commit of step 3" in rec.getMessage() and "MiB/s" in rec.getMessage()


def test_commit_refusal_is_a_warning_with_its_code(tmp_path, job_log: EventLog) -> None:
    storage = open_storage(tmp_path / "ck", create=True)
    attempt = new_attempt_id(5)
    w = ShardWriter(storage, attempt, 0)
    w.add_tensor("w", np.zeros(4, np.float32))
    idx = w.finish()
    with pytest.raises(WriterMissingError):
        commit(storage, attempt, step=5, indexes=[idx], expected_writers=[0, 1])
    (refused,) = job_log.events("commit.refused")
    assert refused["code"] == "PCK-WRITER-MISSING" and refused["attempt_id"] == attempt
    rec = job_log.record("commit.refused")
    assert rec.levelno == logging.WARNING and "refused: [PCK-WRITER-MISSING]" in rec.getMessage()
    assert not job_log.events("commit.finished")


def test_gc_logs_what_it_deleted(tmp_path, job_log: EventLog) -> None:
    for step in (1, 2, 3):
        portable_ckpt.save_arrays(tmp_path / "ck", {"w": np.zeros(4, np.float32)}, step=step)
    rep = portable_ckpt.gc(tmp_path / "ck", keep=1)
    (done,) = job_log.events("gc.finished")
    assert done["deleted"] == rep.deleted and len(rep.deleted) == 2 and done["kept"] == rep.kept


def test_copy_logs_started_and_finished_with_files_bytes_seconds(tmp_path, job_log) -> None:
    m = portable_ckpt.save_arrays(tmp_path / "src", _arrays(), step=3)
    res = copy_version(str(tmp_path / "src"), tmp_path / "dst")
    (started,) = job_log.events("copy.started")
    (done,) = job_log.events("copy.finished")
    where = {"attempt_id": m.attempt_id, "step": 3, "source": res.source,
             "destination": res.destination}
    assert res.destination == (tmp_path / "dst").as_uri()
    assert {k: started[k] for k in where} == where and {k: done[k] for k in where} == where
    assert done["files"] == len(m.files) == res.files >= 1
    assert done["warnings"] == res.warnings and "same local device" in res.warnings[0]
    assert done["bytes"] == sum(f.size for f in m.files.values()) == res.bytes > 24_000
    assert done["seconds"] > 0 and done["mib_per_s"] == mib_per_s(done["bytes"], done["seconds"])
    assert done["already_present"] is False and done["record"] == res.record is not None
    assert done["destination_version"] == f"{res.destination}/{m.attempt_id}"
    rec = job_log.record("copy.finished")
    assert rec.name == "portable_ckpt.io.copy" and rec.levelno == logging.INFO
    msg = rec.getMessage()
    assert msg.startswith(f"copy of {res.source} to {res.destination} finished: ")
    assert f"MiB/s); {res.files} files, version {done['destination_version']}" in msg

    again = copy_version(str(tmp_path / "src"), tmp_path / "dst")  # already there: verified
    assert again.already_present
    done2 = job_log.events("copy.finished")[1]
    assert done2["already_present"] is True and done2["bytes"] == 0
    assert done2["files"] == len(m.files)
    assert "files verified there" in [r for r in job_log.records
                                      if r.getMessage().startswith("copy of")][-1].getMessage()


def test_copy_of_a_corrupt_source_is_refused_with_its_code(tmp_path, job_log) -> None:
    ck, shard = _saved(str(tmp_path / "src"))
    flip_byte(shard, 100, 0x40)
    with pytest.raises(ChecksumError):
        copy_version(str(tmp_path / "src"), tmp_path / "dst")
    (started,) = job_log.events("copy.started")
    (refused,) = job_log.events("copy.refused")
    assert refused["code"] == "PCK-CHECKSUM" and refused["attempt_id"] == ck.id
    assert refused["source"] == started["source"] == ck.path
    rec = job_log.record("copy.refused")
    assert rec.levelno == logging.WARNING and "refused: [PCK-CHECKSUM]" in rec.getMessage()
    assert not job_log.events("copy.finished") and not job_log.events("copy.failed")
    assert portable_ckpt.list_versions(str(tmp_path / "dst")) == []  # nothing published, nothing left


def test_copy_failing_otherwise_logs_copy_failed(tmp_path, job_log) -> None:
    portable_ckpt.save_arrays(tmp_path / "src", _arrays(), step=3)

    def broken(done: int, total: int) -> None:
        raise RuntimeError("progress display went away")

    with pytest.raises(RuntimeError):
        copy_version(str(tmp_path / "src"), tmp_path / "dst", progress=broken)
    (failed,) = job_log.events("copy.failed")
    assert failed["error"] == "RuntimeError: progress display went away"
    assert failed["step"] == 3 and job_log.record("copy.failed").levelno == logging.ERROR
    assert not job_log.events("copy.finished")


def test_cli_copy_verbose_shows_the_copy_events(tmp_path, capsys) -> None:
    portable_ckpt.save_arrays(tmp_path / "src", _arrays(), step=3)
    rc, _, err = _main(capsys, "-v", "copy", str(tmp_path / "src"), str(tmp_path / "dst"))
    assert rc == 0
    assert "INFO portable_ckpt.io.copy: copy of " in err and " started" in err
    assert "finished: " in err


_SAVE = """
import logging, sys, numpy as np, portable_ckpt
portable_ckpt.save_arrays(sys.argv[1], {'w': np.zeros(4, np.float32)}, step=1)
print('--- configured', file=sys.stderr)
logging.basicConfig(level=logging.INFO)
portable_ckpt.save_arrays(sys.argv[1], {'w': np.zeros(4, np.float32)}, step=2)
"""


def test_quiet_until_the_application_configures_logging(tmp_path) -> None:
    assert any(
        isinstance(h, logging.NullHandler) for h in logging.getLogger(LOGGER_NAME).handlers
    )
    out = subprocess.run(
        [sys.executable, "-c", _SAVE, str(tmp_path / "a")],
        capture_output=True, text=True, timeout=120, check=True,
    )
    quiet, _, shown = out.stderr.partition("--- configured\n")
    assert quiet == "" and out.stdout == ""
    assert "INFO:portable_ckpt.io:commit of step 2" in shown
    assert "finished:" in shown and "MiB/s" in shown


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        rc = main(list(args))
    except SystemExit as exc:  # --help, --version
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_verbose_shows_the_log_and_quiet_hides_it(tmp_path, capsys) -> None:
    root = str(tmp_path / "ck")
    for step in (1, 2, 3):
        portable_ckpt.save_arrays(root, {"w": np.zeros(4, np.float32)}, step=step)
    capsys.readouterr()
    rc, _, err = _main(capsys, "gc", root, "--keep", "2", "--dry-run")
    assert rc == 0 and "portable_ckpt" not in err
    rc, _, err = _main(capsys, "gc", root, "--keep", "2", "--dry-run", "-v")
    assert rc == 0 and "INFO portable_ckpt.io.gc: gc of" in err
    assert "would delete 1 version(s)" in err
    rc, _, err = _main(capsys, "-v", "gc", root, "--keep", "2", "--dry-run")  # before, too
    assert rc == 0 and "INFO portable_ckpt.io.gc: gc of" in err
    rc, _, err = _main(capsys, "gc", root, "--keep", "2", "--dry-run", "-v", "-q")
    assert rc == 0 and "portable_ckpt" not in err
    assert not [h for h in logging.getLogger(LOGGER_NAME).handlers
                if not isinstance(h, logging.NullHandler)]  # main() removed its handler


def test_help_and_version_name_the_format_versions(capsys) -> None:
    assert FORMAT_VERSIONS == ("1.0", "1.1", "1.2", "1.3")
    _, helped, _ = _main(capsys, "--help")
    _, versioned, _ = _main(capsys, "--version")
    for out in (" ".join(helped.split()), " ".join(versioned.split())):
        assert f"reads and writes format versions {', '.join(FORMAT_VERSIONS)}" in out
    assert versioned.startswith(f"portable-ckpt {portable_ckpt.__version__}")


# -- checksum failures name what the bad block holds ----------------------------------------------


def _saved(root: str) -> tuple[portable_ckpt.Checkpoint, str]:
    portable_ckpt.save_arrays(root, _arrays(), step=3, entries={"cfg": {"lr": 0.1}})
    ck = portable_ckpt.open(root)
    shard = next(p for p in ck.manifest.files if p.endswith(".safetensors"))
    assert ck.manifest.files[shard].checksum.block_size == 4096
    return ck, os.path.join(ck.path, shard)


def test_reader_checksum_error_names_the_tensors_in_the_block(tmp_path) -> None:
    ck, shard = _saved(str(tmp_path / "ck"))
    hdr = ck._header(next(p for p in ck.manifest.files if p.endswith(".safetensors")))
    a, b = hdr.tensors["model/a@0,0"], hdr.tensors["model/b@0"]
    assert a.end == b.start and a.start < 8192 < a.end < 12288  # block 2 holds both
    flip_byte(shard, 12000, 0x40)
    with pytest.raises(ChecksumError) as ei:
        portable_ckpt.open(str(tmp_path / "ck")).read("model/b")
    msg = ei.value.message
    first = (8192 - a.start) // 4
    assert "bytes [8192:12288] (block 2)" in msg
    assert (
        f"tensor 'model/a' range offsets [0, 0] lengths [30, 100] (elements [{first}:3000] of "
        "its 3000, row-major)" in msg
    )
    last = -(-(12288 - b.start) // 4)
    assert f"tensor 'model/b' range offsets [0] lengths [5000] (elements [0:{last}] of" in msg
    assert msg.endswith("the file is corrupt — restore it from a copy or use an older version")
    assert ei.value.span == (8192, 12288)


def test_verify_deep_names_the_tensor(tmp_path, capsys) -> None:
    root = str(tmp_path / "ck")
    ck, shard = _saved(root)
    flip_byte(shard, -10, 0x40)  # the last block: only model/b's tail
    rc, out, _ = _main(capsys, "verify", "--deep", root)
    assert rc == 1
    assert "PCK-CHECKSUM" in out and "tensor 'model/b' range offsets [0]" in out
    assert "model/a" not in out
    errors = portable_ckpt.open(root).verify(deep=True)
    assert [e.code for e in errors] == ["PCK-CHECKSUM"]
    assert "elements [" in errors[0].message and "of its 5000" in errors[0].message


def test_a_damaged_header_block_says_so_and_lists_the_files_tensors(tmp_path) -> None:
    root = str(tmp_path / "ck")
    _, shard = _saved(root)
    flip_byte(shard, 20, 0x40)  # inside the JSON header
    errors = portable_ckpt.open(root).verify(deep=True)
    (err,) = [e for e in errors if e.code == "PCK-CHECKSUM"]
    assert "(block 0)" in err.message and "shard header" in err.message
    assert "tensor 'model/a'" in err.message and "tensor 'model/b'" in err.message


def test_a_damaged_entry_value_names_the_entry(tmp_path) -> None:
    root = str(tmp_path / "ck")
    ck, _ = _saved(root)
    (value,) = ck.manifest.entries["cfg"].values
    flip_byte(os.path.join(ck.path, value.file), 2, 0x40)
    with pytest.raises(ChecksumError, match=r"the block holds the value of entry 'cfg'"):
        portable_ckpt.open(root).entry("cfg")
