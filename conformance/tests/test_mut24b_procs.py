"""Mutation audit 24b, conformance/procs.py: preflight of the adapter command, the import
errors that make a run "infrastructure", and what an Outcome says of a process.

Every test runs real processes (an adapter script, a fake interpreter) in a temporary directory.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance.procs import (
    Adapter,
    InfrastructureError,
    KillPlan,
    count_trace_progress,
    progress_mode,
)

from .conftest import needs_tracing


def _job(tmp: Path, name: str = "job.json") -> Path:
    p = tmp / name
    p.write_text("{}")
    return p


def _script(tmp: Path, name: str, text: str) -> list[str]:
    p = tmp / name
    p.write_text(text)
    return [sys.executable, str(p)]


def test_preflight_finds_the_module_behind_interpreter_options(tmp_path: Path) -> None:
    """``python3.X -W ignore -X dev -m MODULE``: the module is MODULE (an option's value is not
    a script), whatever the interpreter's versioned name; a missing one is found before any case."""
    py = tmp_path / "python3.99"
    py.symlink_to(sys.executable)
    for cmd in ([str(py), "-m", "no_such_adapter_module_24b"],
                [sys.executable, "-W", "ignore", "-X", "dev", "-m", "no_such_adapter_module_24b"]):
        with pytest.raises(InfrastructureError, match="no_such_adapter_module_24b"):
            Adapter(cmd, cwd=tmp_path).preflight()
    Adapter([str(py), "-W", "ignore", "-m", "json.tool"], cwd=tmp_path).preflight()  # exists


def test_preflight_refuses_a_command_that_is_not_executable(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter.sh"
    adapter.write_text("#!/bin/sh\nexit 0\n")
    adapter.chmod(0o644)
    with pytest.raises(InfrastructureError, match="not an executable file"):
        Adapter([str(adapter)], cwd=tmp_path).preflight()
    adapter.chmod(0o755)
    Adapter([str(adapter)], cwd=tmp_path).preflight()
    with pytest.raises(InfrastructureError, match=r"missing_24b\.py' does not exist"):
        Adapter([sys.executable, "missing_24b.py"], cwd=tmp_path).preflight()


@pytest.mark.parametrize("body", ["#!/bin/sh\nexit 1\n",  # the probe fails, not "not found"
                                  "no shebang: exec fails with ENOEXEC\n"])  # the probe cannot run
def test_a_module_probe_that_does_not_say_not_found_is_left_to_the_run(tmp_path: Path,
                                                                       body: str) -> None:
    """Only a definite "not found" (the probe's exit 3) is an infrastructure error at
    preflight; an interpreter whose probe fails otherwise, or cannot start, is judged by its
    own run."""
    py = tmp_path / "python"
    py.write_text(body)
    py.chmod(0o755)
    Adapter([str(py), "-m", "some_module"], cwd=tmp_path).preflight()


def test_progress_mode_prefers_the_trace() -> None:
    assert progress_mode(True) == "trace"
    assert progress_mode(False) in ("proc", "time")


TOP_LEVEL_IMPORT = "import {name}  # noqa\n"


def test_import_errors_that_make_a_run_infrastructure(tmp_path: Path) -> None:
    """A top-level import of a missing module, however long its name (the tail read of
    standard error keeps a whole traceback), is an import error; the count is of processes."""
    long_name = "no_such_module_" + "x" * 70
    a = Adapter(_script(tmp_path, "imp.py", TOP_LEVEL_IMPORT.format(name=long_name)), cwd=tmp_path)
    o = a.run(_job(tmp_path))
    assert o.rc == 1
    assert a.ended == 1 and a.import_failures == 1
    assert a.cannot_import is not None and long_name in a.cannot_import


@pytest.mark.parametrize("text", [
    # the last line names an import error, but it is a RuntimeError's message
    "raise RuntimeError('ImportError: wrapped')\n",
    # an import error's line printed by the writer, with no traceback at all
    "import sys\nsys.stderr.write(\"ModuleNotFoundError: No module named 'x'\\n\")\n"
    "raise SystemExit(1)\n",
    # a module imported inside the job's work (a codec's): the writer's own failure
    "def write_job():\n    import no_such_codec_module_24b  # noqa\n\nwrite_job()\n",
], ids=["message-mentions-ImportError", "no-traceback", "inside-a-function"])
def test_not_an_import_error(tmp_path: Path, text: str) -> None:
    """Only a traceback ending in ``ModuleNotFoundError``/``ImportError`` itself is an import
    error: such a writer failed (a verdict), it is not an environment without a module."""
    a = Adapter(_script(tmp_path, "w.py", text), cwd=tmp_path)
    o = a.run(_job(tmp_path))
    assert o.rc == 1 and a.ended == 1
    assert a.import_failures == 0 and a.cannot_import is None


def test_one_process_that_ran_means_the_adapter_can_import(tmp_path: Path) -> None:
    """A writer that imports and one that does not (in one save): the adapter's environment
    is fine, the failure is a verdict (cannot_import is None)."""
    cmd = _script(tmp_path, "half.py", "import sys\nif 'bad' in sys.argv[-1]:\n"
                                       "    import no_such_module_24b  # noqa\n")
    a = Adapter(cmd, cwd=tmp_path)
    good, bad = a.run_all([_job(tmp_path, "good.json"), _job(tmp_path, "bad.json")])
    assert (good.rc, bad.rc) == (0, 1)
    assert a.ended == 2 and a.import_failures == 1
    assert a.cannot_import is None


def test_an_outcome_times_the_process_not_the_machine(tmp_path: Path) -> None:
    o = Adapter(_script(tmp_path, "q.py", "pass\n"), cwd=tmp_path).run(_job(tmp_path))
    assert o.rc == 0 and 0 < o.seconds < 30, o.seconds


@needs_tracing
def test_a_kill_after_the_last_event_kills(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness may time a kill at the save's last progress event (ceil(at * total) ==
    total): the process, still alive after it, is killed there."""
    root = tmp_path / "root"
    root.mkdir()
    cmd = _script(tmp_path, "w.py", "import os, sys, time\nroot = sys.argv[1]\n"
                  "for i in range(3):\n"
                  "    with open(os.path.join(root, f'f{i}'), 'wb') as f:\n"
                  "        f.write(b'x' * 10)\n"
                  "time.sleep(float(os.environ.get('PCK_24B_SLEEP', '0')))\n")
    cmd.insert(2, str(root))
    a = Adapter(cmd, timeout=60, trace=True, cwd=tmp_path)
    first = a.run(_job(tmp_path, "first.json"))
    total = count_trace_progress(first.trace, str(root))
    assert first.rc == 0 and total >= 6
    for f in root.iterdir():
        f.unlink()
    monkeypatch.setenv("PCK_24B_SLEEP", "4")
    o = a.run(_job(tmp_path, "second.json"), KillPlan(0, total, "trace", str(root)))
    assert o.killed and o.rc == -9 and o.progress == total, (o.killed, o.rc, o.progress, total)
    assert o.seconds < 4


#: a shell wrapper (two commands: the shell cannot exec its child) whose child writes 100 kB
#: every 50 ms for 1.5 s
WRITING_WRAPPER = """#!/bin/sh
true
"{py}" -c 'import sys, time
f = open(sys.argv[1] + ".bin", "wb")
for i in range(30):
    f.write(b"x" * 100000); f.flush(); time.sleep(0.05)' "$1"
echo done
"""


@pytest.mark.skipif(progress_mode(False) != "proc", reason="no /proc/<pid>/io")
def test_a_byte_timed_kill_counts_the_wrappers_children(tmp_path: Path) -> None:
    """Without a trace, a kill is timed on the bytes the victim's process tree wrote: those of
    the writer below a shell wrapper count (else the kill never comes, the 'crash' never
    happens and the case tests nothing)."""
    sh = tmp_path / "adapter.sh"
    sh.write_text(WRITING_WRAPPER.format(py=sys.executable))
    sh.chmod(0o755)
    o = Adapter([str(sh)], timeout=30, cwd=tmp_path).run(_job(tmp_path),
                                                         KillPlan(0, 200000, "proc"))
    assert o.killed and o.rc == -9 and o.progress >= 200000, (o.killed, o.rc, o.progress)
    assert o.seconds < 1.4
