"""What a killed conversion leaves beside DST, and what the next conversion there removes.

Conversion review M4: ``kill -9`` of a conversion to a non-portable target left its hidden
staging (the temporary portable version of X → Y, the staged target, a torch export's scratch)
beside DST for good; a rerun succeeded and left it too. Now each staging directory names its
owner (host, pid, start time, machine) and the next conversion to a non-portable target in the
same directory removes the staging of owners that are provably gone (or, where the owner cannot
be asked, untouched for an hour), keeps anything else, and says which (path, bytes, why).

The kills are real: a child ``portable-ckpt convert`` stops at a phase
(``_kill_convert.py``) and is sent SIGKILL there.
"""

# ruff: noqa: E402
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file

import portable_ckpt.convert._staging as publish
from portable_ckpt.convert import convert

pytestmark = pytest.mark.torch

_CHILD = Path(__file__).with_name("_kill_convert.py")
_HOUR = 3600.0


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """An HF directory of about 300 KiB (an X → Y conversion goes through a staged portable version)."""
    d = tmp_path / "src"
    d.mkdir()
    g = torch.Generator().manual_seed(0)
    save_file({"layer.w": torch.randn(256, 256, generator=g), "b": torch.arange(1000)},
              str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def _start(phase: str, *args: str) -> subprocess.Popen[str]:
    """A ``convert`` child stopped at ``phase`` (it has printed ``PHASE <phase>``)."""
    p = subprocess.Popen([sys.executable, str(_CHILD), phase, "convert", *args, "-q"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if line != f"PHASE {phase}\n":
        p.kill()
        pytest.fail(f"child did not reach {phase}: {line!r} {p.communicate()[1]}")
    return p


def _kill(p: subprocess.Popen[str], sig: int = signal.SIGKILL) -> int:
    p.send_signal(sig)
    p.communicate(timeout=60)
    return p.returncode


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "portable_ckpt.cli.main", "convert", *args],
                          capture_output=True, text=True, timeout=120)


def _hidden(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.startswith("."))


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _files(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


def _reference(src: Path, tmp_path: Path, to: str, name: str) -> dict[str, bytes]:
    ref = tmp_path / f"ref-{to}" / name
    convert(src, ref, dst_format=to)
    return _files(ref)


def _name(*, host: str = "otherhost", pid: int = 4242, start: int = 12345,
          machine: str = "abcdefabcdef") -> str:
    return f".pck-staging-{host}-{pid}-{start}-{machine}-{secrets.token_hex(6)}"


def _staging(parent: Path, name: str, *, age: float = 0.0) -> Path:
    """A staging directory named ``name`` with a file and a subdirectory, all ``age`` s old."""
    d = parent / name
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "data").write_bytes(b"x" * 5000)
    if age:
        t = time.time() - age
        for p in (d / "sub" / "data", d / "sub", d):
            os.utime(p, (t, t), follow_symlinks=False)
    return d


@pytest.mark.parametrize(
    ("phase", "route", "name"),
    [
        ("hub", "hf", "model"),  # HF -> HF: the temporary portable version written
        ("publish", "hf", "model"),  # ... and the target staged in full, about to be renamed
        ("torch-save", "torch", "model.pt"),  # HF -> torch: the export's scratch, the staged file
        ("publish", "torch", "model.pt"),
    ],
)
def test_a_conversion_killed_with_sigkill_leaves_nothing_after_a_rerun(
    src: Path, tmp_path: Path, phase: str, route: str, name: str
) -> None:
    want = _reference(src, tmp_path, route, name)
    out = tmp_path / "out"
    out.mkdir()
    dst = out / name
    child = _start(phase, str(src), str(dst), "--to", route)
    left = [out / n for n in _hidden(out)]
    assert left and sum(map(_du, left)) > 250_000  # the review's debris: the hub, the target
    assert _kill(child) == -signal.SIGKILL
    assert not dst.exists() and [out / n for n in _hidden(out)] == left

    rerun = _cli(str(src), str(dst), "--to", route, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert _hidden(out) == [] and os.listdir(out) == [name]  # no staging of either run
    assert _files(dst) == want  # bit-exact
    told = json.loads(rerun.stdout)["staging"]
    assert sorted(n["path"] for n in told) == sorted(map(str, left))
    assert all(n["removed"] and n["bytes"] > 0 and "gone" in n["why"] for n in told)
    assert sum(n["bytes"] for n in told) > 250_000
    for p in left:
        assert f"removed conversion staging {p}" in rerun.stderr  # said without --json too


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
@pytest.mark.parametrize("phase", ["hub", "publish", "torch-save"])
def test_sigterm_and_sigint_still_remove_all_staging(
    src: Path, tmp_path: Path, sig: int, code: int, phase: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    child = _start(phase, str(src), str(out / "model.pt"), "--to", "torch")
    assert _hidden(out)
    assert _kill(child, sig) == code
    assert os.listdir(out) == []


def test_a_live_conversions_staging_is_kept_while_a_dead_ones_is_removed(
    src: Path, tmp_path: Path
) -> None:
    """Three conversions into one directory: one killed, one stopped (alive), one run now."""
    want = _reference(src, tmp_path, "hf", "a")
    out = tmp_path / "out"
    out.mkdir()
    live = _start("publish", str(src), str(out / "a"), "--to", "hf")
    try:
        live_left = _hidden(out)
        assert len(live_left) == 2  # its temporary portable version and its staged target
        dead = _start("publish", str(src), str(out / "dead"), "--to", "hf")  # (it swept too)
        dead_left = sorted(set(_hidden(out)) - set(live_left))
        assert len(dead_left) == 2
        _kill(dead)
        rep = convert(src, out / "b", dst_format="hf")
        assert _hidden(out) == live_left  # the live one's kept, the dead one's removed
        assert [n.removed for n in rep.staging] == [True, True]
        assert sorted(os.path.basename(n.path) for n in rep.staging) == dead_left
        assert live.stdin is not None
        live.stdin.write("\n")  # let it finish: its staging was not touched
        live.stdin.flush()
        assert live.wait(60) == 0, live.communicate()[1]
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()
    assert _files(out / "a") == want == _files(out / "b")
    assert _hidden(out) == []


def test_staging_whose_owner_cannot_be_asked_is_removed_only_after_an_hour_untouched(
    src: Path, tmp_path: Path
) -> None:
    """Another host's (another boot id or pid namespace): only the age of every file decides."""
    out = tmp_path / "out"
    out.mkdir()
    fresh = _staging(out, _name(host="node-7"))
    old = _staging(out, _name(host="node-8"), age=2 * _HOUR)
    touched = _staging(out, _name(host="node-9"), age=2 * _HOUR)
    (touched / "sub" / "data").touch()  # one file changed recently: the whole tree is kept
    rep = convert(src, out / "m", dst_format="hf")
    assert fresh.is_dir() and touched.is_dir() and not old.exists()
    by = {n.path: n for n in rep.staging}
    assert by[str(old)].removed and by[str(old)].bytes == 5000
    assert "pid 4242 on node-8" in by[str(old)].why
    for kept in (fresh, touched):
        note = by[str(kept)]
        assert not note.removed and f"rm -rf -- {kept}" in note.why and " s ago: kept" in note.why
    assert sorted(_hidden(out)) == sorted([fresh.name, touched.name])


def test_same_machine_owner_decides_by_pid_and_start_time_whatever_the_age(
    src: Path, tmp_path: Path
) -> None:
    """A live pid with its recorded start time keeps its staging after hours; another start
    time is a reused pid (the owner is gone): removed at once."""
    host, _, _, machine = publish._me()
    mine = publish._start_ticks(os.getpid())
    assert mine and machine != "none"
    pid = os.getpid()  # a live process: this test's
    live = _staging(out := tmp_path / "out", _name(host=host, pid=pid, start=mine, machine=machine),
                    age=5 * _HOUR)
    live_child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                  stdin=subprocess.PIPE)
    try:
        ticks = None
        while ticks is None:  # readable once the child is started
            ticks = publish._start_ticks(live_child.pid)
        other = _staging(out, _name(host=host, pid=live_child.pid, start=ticks, machine=machine),
                         age=5 * _HOUR)
        reused = _staging(out, _name(host=host, pid=live_child.pid, start=ticks + 1,
                                     machine=machine))
        rep = convert(src, out / "m", dst_format="hf")
    finally:
        live_child.kill()
        live_child.wait()
    assert live.is_dir() and other.is_dir() and not reused.exists()
    assert [(n.path, n.removed) for n in rep.staging] == [(str(reused), True)]
    assert "gone" in rep.staging[0].why
    rep = convert(src, out / "n", dst_format="hf")  # the child is gone now: its staging goes
    assert [(n.path, n.removed) for n in rep.staging] == [(str(other), True)]
    assert live.is_dir()


def test_foreign_entries_with_similar_names_are_kept(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    _staging(tmp_path, "elsewhere")
    foreign = [
        _staging(out, ".pck-staging-notours", age=2 * _HOUR),  # not the tool's exact name
        _staging(out, _name() + "x", age=2 * _HOUR),
        _staging(out, ".pck-stagingx-h-1-2-abcdefabcdef-abcdefabcdef", age=2 * _HOUR),
    ]
    link = out / _name()
    link.symlink_to(elsewhere, target_is_directory=True)  # the exact name, but a symlink
    plain = out / _name()
    plain.write_bytes(b"a file")
    os.utime(plain, (0, 0))
    stale = _staging(out, _name(), age=2 * _HOUR)  # the one this run removes
    rep = convert(src, out / "m", dst_format="hf")
    assert not stale.exists()
    assert all(p.is_dir() and (p / "sub" / "data").stat().st_size == 5000 for p in foreign)
    assert link.is_symlink() and (elsewhere / "sub" / "data").exists()
    assert plain.read_bytes() == b"a file"
    by = {n.path: n for n in rep.staging}
    assert by[str(stale)].removed
    assert not by[str(link)].removed and not by[str(plain)].removed
    assert not any(str(p) in by for p in foreign)  # not ours: not even named


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_another_users_staging_is_kept_and_told(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    theirs = _staging(out, _name(), age=2 * _HOUR)
    for p in (theirs, theirs / "sub", theirs / "sub" / "data"):
        os.chown(p, 54321, 54321, follow_symlinks=False)
    rep = convert(src, out / "m", dst_format="hf")
    assert (theirs / "sub" / "data").exists()
    assert [(n.path, n.removed) for n in rep.staging] == [(str(theirs), False)]
    assert "uid 54321" in rep.staging[0].why and "rm -rf" in rep.staging[0].why


def test_staging_that_cannot_be_read_in_full_is_kept(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """"Could not read" is never "abandoned": an undated tree is kept (and said), as is one
    too large to date within the bound."""
    from tests._cli import unprivileged_cli

    out = tmp_path / "out"
    out.mkdir()
    locked = _staging(out, _name(), age=2 * _HOUR)
    (locked / "sub").chmod(0)
    try:
        run = unprivileged_cli("convert", str(src), str(out / "m"), "--to", "hf", "--json")
    finally:
        (locked / "sub").chmod(0o700)
    assert run.returncode == 0, run.stderr
    assert (locked / "sub" / "data").exists()
    [note] = json.loads(run.stdout)["staging"]
    assert note["path"] == str(locked) and not note["removed"]
    assert "could not read it" in note["why"] and f"rm -rf -- {locked}" in note["why"]

    monkeypatch.setattr(publish, "MAX_WALK", 1)  # two entries in it: past the bound
    rep = convert(src, out / "n", dst_format="hf")
    assert (locked / "sub" / "data").exists()
    assert [(n.path, n.removed) for n in rep.staging] == [(str(locked), False)]
    assert "not dated in full" in rep.staging[0].why


def test_leftovers_of_earlier_versions_and_of_a_killed_sweep(src: Path, tmp_path: Path) -> None:
    """Earlier versions' staging names no owner: told with its size and the command, never
    removed. A removal a killed sweep began (``.pck-swept-*``) is finished."""
    out = tmp_path / "out"
    out.mkdir()
    legacy = [_staging(out, n, age=2 * _HOUR)
              for n in (".pck-convert-ab12cd_3", ".pck-export-zz99yy00", ".m.tmp-0123456789ab")]
    other_dst = _staging(out, ".x.tmp-0123456789ab", age=2 * _HOUR)  # another DST's: not named
    swept = _staging(out, ".pck-swept-0123456789ab")
    rep = convert(src, out / "m", dst_format="hf")
    assert not swept.exists() and all(p.is_dir() for p in [*legacy, other_dst])
    by = {n.path: n for n in rep.staging}
    assert by[str(swept)].removed
    for p in legacy:
        assert not by[str(p)].removed and by[str(p)].bytes == 5000
        assert f"rm -rf -- {p}" in by[str(p)].why
    assert str(other_dst) not in by


def test_the_sweep_is_bounded(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for _ in range(3):
        _staging(out, _name(), age=2 * _HOUR)
    monkeypatch.setattr(publish, "MAX_SWEPT", 2)
    rep = convert(src, out / "m", dst_format="hf")
    assert len(_hidden(out)) == 1 and sum(n.removed for n in rep.staging) == 2
    assert "1 more staging entries not looked at" in rep.staging[-1].why
    rep = convert(src, out / "n", dst_format="hf")
    assert _hidden(out) == [] and [n.removed for n in rep.staging] == [True]


def test_a_conversion_whose_staging_was_swept_publishes_nothing(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversion stopped for over an hour, seen from another host, loses its staging: the
    sweep's first step is a rename, so the stopped one fails at its own rename onto DST (with
    nothing published) instead of publishing a half-removed directory."""
    out = tmp_path / "out"
    out.mkdir()
    stopped = _start("publish", str(src), str(out / "a"), "--to", "hf")
    try:
        left = [out / n for n in _hidden(out)]
        t = time.time() - 2 * _HOUR
        for top in left:
            for p in [*top.rglob("*"), top]:
                os.utime(p, (t, t), follow_symlinks=False)
        monkeypatch.setattr(publish, "_me", lambda: ("elsewhere", 1, 1, "ffffffffffff"))
        rep = convert(src, out / "b", dst_format="hf")
        assert sorted(n.path for n in rep.staging if n.removed) == sorted(map(str, left))
        assert stopped.stdin is not None
        stopped.stdin.write("\n")
        stopped.stdin.flush()
        _, err = stopped.communicate(timeout=60)
    finally:
        if stopped.poll() is None:
            stopped.kill()
            stopped.wait()
    assert stopped.returncode != 0 and "removed meanwhile" in err and "nothing was published" in err
    assert not (out / "a").exists() and _hidden(out) == [] and os.listdir(out) == ["b"]


# -- the re-attack of the sweep (re-attack 25) --------------------------------------------------

_BIND_SWEEP = """
set -e
mount --bind "$1" "$2/sub"
"$3" -c 'import sys; from portable_ckpt.convert import convert
rep = convert(sys.argv[1], sys.argv[2], dst_format="hf")
print([(n.removed, n.why) for n in rep.staging])' "$4" "$5"
ls "$2/sub"
umount "$2/sub"
"""


def _precious_or_skip(tmp_path: Path) -> Path:
    """A directory holding ``file1`` to bind-mount, or skip where no mount namespace is made."""
    import shutil

    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -m)")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "file1").write_bytes(b"keep me")
    return precious


def test_a_mount_inside_a_dead_staging_is_never_entered(src: Path, tmp_path: Path) -> None:
    """M1: a bind mount at ``<staging>/sub`` (same file system, same ``st_dev``): the sweep's
    ``shutil.rmtree`` deleted the mounted directory's files. The staging is kept and said."""
    precious = _precious_or_skip(tmp_path)
    host, _, _, machine = publish._me()
    dead = _staging(out := tmp_path / "out", _name(host=host, pid=2**22 - 3, start=1,
                                                    machine=machine))
    p = subprocess.run(["unshare", "-m", "sh", "-c", _BIND_SWEEP, "sh", str(precious), str(dead),
                        sys.executable, str(src), str(out / "m")],
                       capture_output=True, text=True, timeout=300,
                       env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[2] / "src")})
    assert p.returncode == 0, p.stderr[-2000:]
    assert "is mounted inside it: kept" in p.stdout, p.stdout
    assert (precious / "file1").read_bytes() == b"keep me"
    assert dead.is_dir()


def test_a_deep_dead_staging_is_removed_without_recursion(src: Path, tmp_path: Path) -> None:
    """L1: 1,500 nested directories in a dead conversion's staging: ``RecursionError``, exit 1,
    at every later conversion into that directory."""
    host, _, _, machine = publish._me()
    dead = _staging(out := tmp_path / "out", _name(host=host, pid=2**22 - 3, start=1,
                                                    machine=machine))
    deep = str(dead)
    for _ in range(1500):  # (past the interpreter's recursion limit, within PATH_MAX)
        deep = os.path.join(deep, "d")
        os.mkdir(deep)
    try:
        rep = convert(src, out / "m", dst_format="hf")
        assert [(n.path, n.removed) for n in rep.staging] == [(str(dead), True)]
        assert _hidden(out) == []
    finally:  # (pytest's own clean-up of old temporary directories recurses: leave no tree)
        for left in out.glob(".pck-*"):
            publish._remove_tree(str(left))


def test_removing_a_deep_tree_resolves_no_directory_but_its_top(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every directory was resolved (``realpath``: one lstat per component) to look it up among
    the mount points: the 1,500-level tree above took 36 s to remove. Now only a directory
    standing where a mount point below the top is (device and inode) is resolved."""
    deep = top = tmp_path / "dead"
    for _ in range(300):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"x")
    calls: list[str] = []
    real = os.path.realpath

    def counted(path: Any, *a: Any, **k: Any) -> Any:
        calls.append(str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os.path, "realpath", counted)
    assert publish._remove_tree(str(top)) == []
    assert not top.exists()
    assert calls == [str(top)], len(calls)


_BIND_REMOVE = """
set -e
mount --bind "$1" "$2"
"$3" -c 'import sys; import portable_ckpt.convert._staging as s
print(s._remove_tree(sys.argv[1]))' "$4"
ls "$2"
umount "$2"
"""


def test_a_mount_met_deep_in_a_removal_is_left_with_what_it_holds(tmp_path: Path) -> None:
    """A bind mount (same file system) 40 levels down a tree being removed (one made after the
    sweep looked, or met by the removal alone): left as it is and said; the rest removed."""
    precious = _precious_or_skip(tmp_path)
    top = tmp_path / "dead"
    at = top
    for _ in range(40):
        at = at / "d"
    (at / "m").mkdir(parents=True)
    (top / "other").write_bytes(b"x")
    p = subprocess.run(["unshare", "-m", "sh", "-c", _BIND_REMOVE, "sh", str(precious),
                        str(at / "m"), sys.executable, str(top)],
                       capture_output=True, text=True, timeout=120,
                       env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[2] / "src")})
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"{at / 'm'}: another file system is mounted there" in p.stdout, p.stdout
    assert "file1" in p.stdout  # listed through the mount, before it was undone
    assert (precious / "file1").read_bytes() == b"keep me"
    assert not (top / "other").exists() and (at / "m").is_dir()
    publish._remove_tree(str(top))


_MAIN_THREAD_EXITS = """
import ctypes, os, sys, threading, time
d = sys.argv[1]
def write():
    for i in range(600):
        with open(os.path.join(d, "part"), "w") as f:
            f.write(str(i))
        time.sleep(0.1)
threading.Thread(target=write).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)  # the main thread ends; the writer goes on
"""


def test_a_live_owner_whose_main_thread_exited_is_kept(src: Path, tmp_path: Path) -> None:
    """L2: a process whose main thread ended while another writes on shows as a zombie in
    ``/proc/PID/stat``; its staging was removed under it."""
    host, _, _, machine = publish._me()
    out = tmp_path / "out"
    out.mkdir()
    holder = tmp_path / "holder"
    holder.mkdir()
    child = subprocess.Popen([sys.executable, "-c", _MAIN_THREAD_EXITS, str(holder)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        ticks = None
        while ticks is None:
            ticks = publish._start_ticks(child.pid)
        time.sleep(0.3)  # the main thread is gone by now
        live = _staging(out, _name(host=host, pid=child.pid, start=ticks, machine=machine))
        convert(src, out / "m", dst_format="hf")
        assert live.is_dir()
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("name", [".pck-swept-aaaaaaaaaaaa", ".pck-staging-x", ".pck-clock-0",
                                  ".pck-probe-0"])
def test_a_destination_named_like_staging_is_refused(
    src: Path, tmp_path: Path, name: str
) -> None:
    """L3: an export published as ``.pck-swept-<hex>`` was deleted by the next conversion in
    that directory."""
    from portable_ckpt.errors import UsageError

    with pytest.raises(UsageError, match="staging and probes"):
        convert(src, tmp_path / name, dst_format="hf")
    assert not (tmp_path / name).exists()
