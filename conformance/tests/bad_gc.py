#!/usr/bin/env python3
"""The reference gc adapter with one deliberate defect (``PCK_BAD_MODE``).

Proves that ``portable-ckpt-conformance gc`` catches each kind of defect a gc can have:

* ``no-grace``: runs with a grace period of 0 (deletes saves in progress, R-GC-4);
* ``always-delete-invalid``: deletes invalid attempts it was not asked to (R-GC-10);
* ``exit-zero``: exits 0 whatever its gc reported (R-GC-6, R-GC-10, R-GC-11, R-GC-12);
* ``exit-one``: exits 1 whatever happened (a failure, or a report with nothing to report);
* ``keep-more``: keeps one version more than asked (what the rules let go is left);
* ``outside``: deletes a root file that is no attempt (R-GC-5);
* ``ignore-pins``: deletes the pins first, then runs (R-GC-11);
* ``no-mark``: removes a version's commit record without storing a deletion mark first (the
  mark comes after, R-GC-13), seen only under system-call tracing;
* ``data-first``: removes a version's data files before its commit record (R-GC-3), seen
  only under system-call tracing;
* ``drop-records``: after a correct run, removes the drill and verification records of the
  versions it kept (R-DRILL-9 keeps the newest of each kind; R-GC-2 loses its drilled version);
* ``repair-stray``: after a correct run, replaces a ``manifest.json`` symbolic link by a copy of
  its target, and removes a ``manifest.json`` directory (R-GC-14);
* ``junk``: after a correct run, writes a file at the root and into each kept version;
* ``chdir-dotdot``: removes a version's files, its commit record last and no mark, through
  ``chdir(adir); chdir(".."); chdir(aid)`` and relative paths (strace pads the short
  ``chdir("..")``, which the parser dropped: re-attack 26), seen only under tracing;
* ``child-cwd``: a correct gc (``examples/minimal_gc.py``) working in the root by relative paths,
  that starts a child process in another directory (whose ``chdir`` is no ``chdir`` of the gc);
* ``proc-fd``: removes a version's data files through ``/proc/self/fd/N/...`` paths first;
* ``rename-away``: renames a version's directory to ``.trash-<id>`` in the root without a mark,
  then removes its files there, the commit record last;
* ``fake-mark``: stores ``deleting/garbage.json`` (no deletion id) and removes it again before the
  commit record, then deletes without a mark before the record;
* ``rewrite-kept``: after a correct run, removes every file of the versions it kept and writes
  it again, the same bytes;
* ``delete-newest``: keeps the oldest versions where it should keep the newest: deletes the
  ``keep`` newest committed versions (data lost, R-GC-1) and leaves the older ones (an outside
  team's gc bug, whose failure message led with the versions left);
* ``crash``: dies with a traceback on a root holding an invalid attempt (exit 1, no report);
* ``hang``: sleeps past the harness's ``--timeout``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "adapters"))

import reference_gc

MODE = os.environ.get("PCK_BAD_MODE", "")
ROOT = Path()  # the job's root, set by main


def main(argv: list[str]) -> int:
    """Edit the job (or the root) as ``MODE`` says, then run the reference adapter."""
    path = Path(argv[-1])
    job = json.loads(path.read_text(encoding="utf-8"))
    root = Path(job["root"])
    global ROOT
    ROOT = root
    if MODE == "no-grace":
        job["grace_seconds"] = 0
    elif MODE == "always-delete-invalid":
        job["delete_invalid"] = True
    elif MODE == "keep-more":
        job["keep"] += 1
    elif MODE == "outside":
        for p in root.iterdir():
            if p.is_file() and not p.name.startswith("."):
                p.unlink()
    elif MODE == "ignore-pins":
        shutil.rmtree(root / "pins", ignore_errors=True)
        if (root / "pins").is_file():
            (root / "pins").unlink()
    elif MODE == "hang":
        time.sleep(3600)
    elif MODE == "crash" and any(p.is_dir() and not (p / "manifest.json").exists()
                                 and (p / "drills").exists() for p in root.iterdir()):
        raise RuntimeError("a gc that cannot handle a lost commit record")
    if MODE == "child-cwd":
        return _child_cwd(job, root)
    if MODE == "delete-newest":
        committed = sorted(p for p in root.iterdir() if (p / "manifest.json").is_file())
        for a in committed[-job["keep"]:]:
            shutil.rmtree(a)
        print(json.dumps({"reported": []}))
        return 0
    path.write_text(json.dumps(job), encoding="utf-8")
    if MODE in ("no-mark", "data-first", "chdir-dotdot", "proc-fd", "rename-away",
                "fake-mark"):
        _patch_deletion()
    rc = reference_gc.main(argv)
    if MODE in ("drop-records", "repair-stray", "junk", "rewrite-kept"):
        _after(root)
    return 0 if MODE == "exit-zero" else 1 if MODE == "exit-one" else rc


def _child_cwd(job: dict[str, Any], root: Path) -> int:
    """``child-cwd``: the minimal gc in the root, by relative paths, after a child elsewhere."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import minimal_gc

    os.chdir(root)
    elsewhere = Path(__file__).resolve().parents[1] / "examples"  # a long path: not padded
    subprocess.run(["true"], cwd=elsewhere, check=True)  # the child's chdir is its own
    return int(minimal_gc.gc({**job, "root": "."}))


def _after(root: Path) -> None:
    """What ``drop-records``, ``repair-stray`` and ``junk`` do to the root a run left."""
    for a in sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("s")):
        m = a / "manifest.json"
        if MODE == "drop-records":
            for kind in ("drills", "verifications"):
                shutil.rmtree(a / kind, ignore_errors=True)
        elif MODE == "repair-stray" and m.is_symlink():
            data = m.read_bytes()
            m.unlink()
            m.write_bytes(data)
        elif MODE == "repair-stray" and m.is_dir():
            shutil.rmtree(m)
        elif MODE == "junk" and m.is_file():
            (a / "EXTRA").write_text("junk")
        elif MODE == "rewrite-kept":
            for f in sorted(p for p in a.rglob("*") if p.is_file() and not p.is_symlink()):
                data = f.read_bytes()
                f.unlink()
                f.write_bytes(data)
    if MODE == "junk":
        (root / "JUNK.bin").write_bytes(b"junk")


def _patch_deletion() -> None:
    """Inject the order defects into the reference's deletion of one attempt."""
    import portable_ckpt.io.deletion as deletion
    import portable_ckpt.io.gc as gc_mod

    real = deletion.delete_attempt

    def delete_attempt(storage: Any, attempt_id: str, *args: Any, **kwargs: Any) -> None:
        adir = ROOT / attempt_id
        data = sorted(p.relative_to(adir).as_posix() for p in (adir / "data").rglob("*")
                      if p.is_file())
        if MODE in ("no-mark", "fake-mark"):
            kwargs["mark"] = None  # no mark before the record; the re-mark comes after it
        if MODE == "fake-mark" and (adir / "manifest.json").is_file():
            (adir / "deleting").mkdir(exist_ok=True)
            (adir / "deleting" / "garbage.json").write_text("not a mark")
            (adir / "deleting" / "garbage.json").unlink()
        elif MODE == "data-first":
            storage.delete_many([o.path for o in storage.list(f"{attempt_id}/data/")])
        elif MODE == "chdir-dotdot":
            here = os.getcwd()
            os.chdir(adir)
            os.chdir("..")
            os.chdir(attempt_id)  # in adir; a parser that drops chdir("..") thinks adir/aid
            files = sorted((p.relative_to(adir).as_posix() for p in adir.rglob("*")
                            if not p.is_dir()), key=lambda r: r == "manifest.json")
            for rel in files:  # the data first, the record last, no mark
                os.unlink(rel)
            for d in sorted((p for p in adir.rglob("*") if p.is_dir()), key=lambda p: -len(
                    p.parts)):
                os.rmdir(d.relative_to(adir))
            os.chdir(here)
            adir.rmdir()
            return
        elif MODE == "proc-fd":
            fd = os.open(adir, os.O_RDONLY | os.O_DIRECTORY)
            for rel in data:
                os.unlink(f"/proc/self/fd/{fd}/{rel}")
            os.close(fd)
        elif MODE == "rename-away":
            trash = ROOT / f".trash-{attempt_id}"
            os.rename(adir, trash)
            moved = sorted((f for f in trash.rglob("*") if not f.is_dir()),
                           key=lambda f: f.name == "manifest.json")
            for f in moved:
                f.unlink()
            shutil.rmtree(trash)
            return
        real(storage, attempt_id, *args, **kwargs)

    setattr(gc_mod, "delete_attempt", delete_attempt)  # noqa: B010 - not exported there


if __name__ == "__main__":
    sys.exit(main(sys.argv))
