"""Core subcommands: ``ls``, ``inspect``, ``gc`` (``verify`` is in :mod:`.cmd_verify`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from portable_ckpt.cli import _args as A
from portable_ckpt.cli._attempts import say_uncommitted, uncommitted
from portable_ckpt.cli._output import EXIT_UNAVAILABLE, failed_status, progress_bar, say_failed
from portable_ckpt.cli._text import age_seconds, safe, table
from portable_ckpt.errors import (
    CheckpointError,
    NotFoundError,
    StorageError,
)
from portable_ckpt.format.vocab import CODECS, DEFAULT_GRACE_SECONDS, SHORT_GRACE_SECONDS
from portable_ckpt.logs import human_bytes

if TYPE_CHECKING:
    from portable_ckpt.storage import Storage

__all__ = ["register"]

#: ``ls --json`` lists at most this many foreign keys (their count is always given).
_MAX_FOREIGN = 1000


#: Invalid attempts ``ls`` names one by one on stderr (then a count).
_MAX_INVALID_NAMED = 8


def _ls(args: argparse.Namespace) -> int:
    from portable_ckpt.storage import open_storage

    storage = open_storage(args.root)
    with storage.one_root_listing():  # one view of the root, listed once (attack review L5)
        return _ls_root(args, storage)


def _ls_root(args: argparse.Namespace, storage: Storage) -> int:
    """``ls`` of an opened root."""
    from portable_ckpt.io.versions import (
        foreign_keys,
        list_versions,
        mark_pinned,
        newest_first,
        root_must_exist,
    )

    try:
        root_must_exist(storage)
    except NotFoundError as missing:
        local = storage.local_root()
        if args.latest and local is not None and os.path.lexists(local):
            # A file where the root should be: no job starts afresh there (never 1, "none")
            say_failed(args, {**missing.to_json(), "retryable": False}, safe(missing))
            return EXIT_UNAVAILABLE
        raise
    if args.latest:
        return _latest(args, newest_first(storage), storage)
    # with the saves killed while all their objects were uploading: only their parts are stored
    problems: list[CheckpointError] = []
    versions = list_versions(storage, uploads=True, errors=problems, pins=False)
    for exc in problems:
        print(f"portable-ckpt: WARNING: unfinished uploads not listed: {exc}", file=sys.stderr)
    pins_unread = mark_pinned(storage, versions)
    if pins_unread is not None:
        print(f"portable-ckpt: the pins could not be read (any version may be pinned): "
              f"{safe(str(pins_unread))}", file=sys.stderr)
    foreign = foreign_keys(storage)
    # An attempt that could not be read may be the newest version: a restore fails until it
    # can be read (R-ID-5). Said on stderr with its reason, and no success (ops review F7: a
    # cron `ls` reported success): 75 for a storage error, retry (scripting review F6).
    unreadable = [v for v in versions if v.status == "unreadable"
                  or (v.status == "committed" and v.verifications_unreadable)]
    for v in unreadable:
        # Its verification records decide whether a restore takes it (R-DRILL-8): a table
        # that showed "-" read as "never verified" (incident review 2, F3).
        what = f"{v.id}: its verification records" if v.status == "committed" else v.id
        print(f"portable-ckpt: {what} could not be read: {safe(v.error or '?')}",
              file=sys.stderr)
    for v in versions:
        ahead = v.dated_ahead if v.status == "committed" else []
        if ahead:
            # A host whose clock is ahead: its records' ages mean nothing (SRE review 2, W4).
            print(f"portable-ckpt: {v.id}: {len(ahead)} record(s) dated after now "
                  f"({safe(', '.join(ahead[:3]))}{', ...' if len(ahead) > 3 else ''}): the clock "
                  "of the host that wrote them is ahead; VERIFIED shows the newest pass dated "
                  "by now", file=sys.stderr)
        if v.status == "committed" and v.unmoved_cleared:
            # A clearing cut short before its move (spec §14.5): this release sees the version
            # cleared, releases before 1.2 do not, and their retention may delete it (on-call
            # review 3, F1).
            print(f"portable-ckpt: {v.id}: {len(v.unmoved_cleared)} cleared verification "
                  "record(s) not yet moved to verifications/cleared/: releases before format 1.2 "
                  f"count it as failed; `portable-ckpt verify {safe(v.path)} --deep` or a gc "
                  "finishes the move", file=sys.stderr)
    say_uncommitted(uncommitted(storage, versions))
    stored = _stored_sizes(storage, versions)
    code = failed_status(
        [v.error_retryable for v in unreadable]
        + ([pins_unread.retryable] if pins_unread is not None else [])
    )
    if args.json:
        doc = {
            "versions": [{**v.to_json(), **({"bytes": stored[v.id], "bytes_stored": True}
                                            if v.id in stored else {})} for v in versions],
            "foreign_keys": foreign[:_MAX_FOREIGN],
            "foreign_key_count": len(foreign),
        }
        print(json.dumps(doc, indent=2))
        return code
    if foreign:
        # stderr: stdout is the table a script parses (scripting review F10)
        print(f"portable-ckpt: {len(foreign)} entries that are not this format's are ignored: "
              f"{_foreign_urls(storage.url, foreign)}", file=sys.stderr)
    if not versions:
        print(f"no attempts under {safe(args.root)}")
        _child_roots(storage, foreign, args.root)
        return 0
    rows = []
    for v in versions:
        drill = _drill_cell(v.drills)
        last = v.last_pass
        checked = "unreadable" if v.verifications_unreadable else (
            "failed" if v.verification_failed else _passed(last) if v.verified and last else "-")
        # one entry per destination (a copy run again writes a record each time)
        dests = dict.fromkeys(str(c.get("destination", "?")) for c in v.copies if c.get("ok"))
        copies = ", ".join(dests) or "-"
        rows.append(
            [
                v.id,
                str(v.step),
                f"{v.status}, node-local" if v.node_local else
                f"{v.status}, being deleted" if v.being_deleted and v.status == "incomplete"
                else v.status,
                human_bytes(v.bytes) if v.bytes else
                f"{human_bytes(stored[v.id])} stored" if stored.get(v.id) else "-",
                v.committed_at or "-",
                checked,
                drill,
                {True: "yes", False: "-", None: "?"}[v.pinned],
                copies,
            ]
        )
    print(table(rows, ["ID", "STEP", "STATUS", "SIZE", "COMMITTED", "VERIFIED", "DRILL", "PINNED",
                       "COPIES"]))
    invalid = [v for v in versions if v.status == "invalid"]
    for v in invalid[:_MAX_INVALID_NAMED]:
        # The runbook tells a lost commit record from a damaged one by this code (docs review
        # 21, F6): the table showed "invalid" and dashes.
        hint = "" if v.error_code == "PCK-MANIFEST-MISSING" else (  # its message says what to do
            f"; `portable-ckpt verify {safe(v.path)}` names the defect (docs/recovery.md)")
        print(f"portable-ckpt: {v.id}: invalid: {safe((v.error or '?')[:500])}{hint}",
              file=sys.stderr)
    if len(invalid) > _MAX_INVALID_NAMED:
        print(f"portable-ckpt: and {len(invalid) - _MAX_INVALID_NAMED} more invalid attempts "
              "(ls --json gives each error_code)", file=sys.stderr)
    for v in versions:
        if v.status == "stray":
            print(
                f"{v.id}: its manifest.json is not a regular file (a symlink, FIFO, device or "
                "directory): not a version, skipped by readers and never deleted by gc; inspect "
                "it and remove it by hand"
            )
    return code


def _stored_sizes(storage: Storage, versions: list[Any]) -> dict[str, int]:
    """The bytes stored under each incomplete, invalid or stray attempt, by id (one listing each).

    Such an attempt has no valid record to size it by, and its files take space until gc
    removes them: ``ls`` showed ``-`` (and ``bytes: 0``) for a killed save of 3 GiB
    (conversion review). An attempt whose listing fails keeps ``-``: ``ls`` is no place to
    fail for a size.
    """
    out: dict[str, int] = {}
    for v in versions:
        if v.status in ("incomplete", "invalid", "stray") and not v.bytes:
            with contextlib.suppress(CheckpointError):
                out[v.id] = sum(o.size for o in storage.list(f"{v.id}/"))
    return out


def _foreign_urls(root_url: str, keys: list[str], most: int = 5) -> str:
    """The first foreign entries as URLs below the root, as a person removes them.

    ``ls`` of an S3 root named ``e1//x`` as "/" and ``e1/a/../b`` as "a/" (S3 review 24, L3):
    no key to look up or remove.
    """
    base = root_url.rstrip("/")
    shown = ", ".join(safe(f"{base}/{k}") for k in keys[:most])
    return shown + (f", ... ({len(keys) - most} more)" if len(keys) > most else "")


def _drill_cell(drills: list[dict[str, Any]]) -> str:
    """DRILL of ``ls``: the newest drill's result, and whether an earlier one passed.

    "passed" when any had passed hid a newest drill that failed: a weekly drill's alert read
    from ``ls`` stayed green (on-call review 23, F8). Retention still protects the newest
    version a drill passed on (R-GC-2).
    """
    if not drills:
        return "-"
    newest = drills[-1]  # read_annotations gives them oldest first (by finished_at)
    if newest.get("ok") is True:
        return "passed"
    return "failed (passed before)" if any(d.get("ok") is True for d in drills) else "failed"


def _passed(last: dict[str, Any]) -> str:
    """VERIFIED of ``ls``: the kind and age of the newest pass (``passed deep 3h``).

    "passed" alone read as "good now" after a storage incident, when it was a sampled check
    at save time (incident review R5).
    """
    age = age_seconds(last.get("verified_at"))
    if last.get("clock_ahead"):
        return f"passed {last.get('mode')} (dated ahead)"
    if age is None:
        return f"passed {last.get('mode')}"
    for unit, secs in (("d", 86400), ("h", 3600), ("m", 60)):
        if age >= secs:
            return f"passed {last.get('mode')} {int(age // secs)}{unit}"
    return f"passed {last.get('mode')} {max(0, int(age))}s"


def _child_roots(storage: Any, foreign: list[str], root: str, command: str = "ls",
                 *, file: Any = None) -> None:
    """Name the subdirectories that are checkpoint roots (a sweep's: fine-tuning review F8).

    One listing per subdirectory, for the first 20: a directory with an attempt-named child.
    ``command`` is what to run on each (``gc --keep 2`` for gc, whose run on a directory of
    roots did nothing and said ``kept 0: -``: framework review 26, F2).
    """
    from portable_ckpt.format.naming import ATTEMPT_ID_RE

    found = [d for d in (f for f in foreign[:20] if f.endswith("/"))
             if any(ATTEMPT_ID_RE.match(n) for n in storage.list_dirs(d))]
    for d in found:
        print(f"{safe(d)} is a checkpoint root: portable-ckpt {command} "
              f"{safe(root.rstrip('/'))}/{safe(d)}", file=file or sys.stdout)


def _why_passed_over(storage: Any, v: Any) -> str:
    """Why ``ls --latest`` passed over ``v``, a newer attempt than the version it names."""
    if v.status == "committed":
        return "a verification of it failed"
    if v.status != "incomplete":
        return f"it is {v.status}"
    if v.being_deleted:
        return "a gc was deleting it (it holds a deletion mark, no commit record)"
    try:
        # Only entries this format never writes were left there (an odd key gc leaves in
        # place, R-LAYOUT-7): "a save in progress" was said at every poll for good (S3 review
        # 24, L3). (An empty directory is a save that wrote nothing yet.)
        foreign_only = next(iter(storage.list(f"{v.id}/")), None) is None and bool(
            storage.list_foreign(f"{v.id}/"))
    except CheckpointError:
        foreign_only = False
    if foreign_only:
        return ("it holds no file of this format (only entries this format never writes, which "
                f"no tool of it deletes: `portable-ckpt gc` names them; {safe(storage.url)}/"
                f"{v.id}/ may be removed by hand)")
    return "it is incomplete (no commit record: a save in progress, or one cut short)"


def _latest(args: argparse.Namespace, versions: Iterable[Any], storage: Any) -> int:
    """``ls --latest``: the version a restore takes, its path alone (or its row with ``--json``).

    The newest committed version (R-ID-4) that no verification failed: what
    ``CheckpointManager.restore`` tries first on this root. Newer attempts that are not
    versions are passed over with a word on stderr; a newer one whose record (or whose
    verification records) could not be read stops the answer (R-ID-5: it may be the latest),
    as it stops a restore: exit 75 or 69, never 1 ("none"); so do committed versions that all
    failed verification (69). The path is printed as it is (not escaped as in a table).
    ``versions`` come newest first, read level by level as asked (a poll reads the newest
    levels only); the attempts passed over are named on stderr, the first few one by one.
    """
    from portable_ckpt.io.versions import restore_decision

    passed, failed = 0, []
    for v in versions:
        decision = restore_decision(v)
        if decision == "stop":
            what = "the verification records of " if v.status == "committed" else ""
            # Raised: under --json stdout gets the error document (docs review F13: a script
            # could not tell "no version" from "retry"); 75 or 69, never 1 (main._run).
            fix = "retry" if v.error_retryable else "fix what it names"
            raise StorageError(
                f"cannot tell the latest version: {what}{v.id} could not be read "
                f"({v.error or '?'}); a storage error is not 'no version': {fix}",
                path=f"{v.id}/manifest.json", retryable=v.error_retryable,
            )
        if decision == "take":
            if v.node_local:  # (SRE review F3) a script must not take it for a whole version
                print(f"portable-ckpt: {v.id} is a node-local version (spec §14.7): this root "
                      "holds its nodes' files only; read or copy it from the durable root once "
                      "replicated", file=sys.stderr)
            if args.json:
                print(json.dumps(v.to_json(), indent=2))
            elif "\n" in v.path or "\r" in v.path:
                print(f"portable-ckpt: the latest version's path holds a line break: "
                      f"{safe(v.path)}; use --json", file=sys.stderr)
                return EXIT_UNAVAILABLE  # there is one: never 1, "none"
            else:  # the path exactly as it is, for scripts (a table escapes it: F14)
                sys.stdout.flush()
                sys.stdout.buffer.write(os.fsencode(v.path) + b"\n")
                sys.stdout.buffer.flush()
            return 0
        passed += 1
        if v.status == "committed":
            failed.append(v.id)
        if passed <= _PASSED_NAMED:
            print(f"portable-ckpt: {v.id} passed over: {_why_passed_over(storage, v)}",
                  file=sys.stderr)
        elif passed == _PASSED_NAMED + 1:  # one line a poll, not one per abandoned attempt
            print("portable-ckpt: more attempts passed over (`portable-ckpt ls` lists them)",
                  file=sys.stderr)
    if failed:
        # Versions there are, none a restore takes: not "none", which starts a job afresh
        # (and its retention then deletes them); a manager refuses too (SRE review S9).
        message = (
            f"no version under {args.root} is restored: its {len(failed)} committed "
            f"version(s) failed verification ({', '.join(failed[:3])}"
            f"{', ...' if len(failed) > 3 else ''}), which no restore takes (R-DRILL-8); a "
            "CheckpointManager refuses to start afresh over them. Read one explicitly "
            "(`portable-ckpt verify ROOT/ID --deep` tells what failed), or move them away "
            "to start afresh"
        )
        say_failed(args, {"code": NotFoundError.code, "message": message, "retryable": False,
                          "failed_verification": failed}, safe(message))
        return EXIT_UNAVAILABLE
    from portable_ckpt.io.versions import other_format_hint

    raise NotFoundError(f"no committed version under {args.root}{other_format_hint(storage)}",
                        path=args.root)


#: ``ls --latest`` names this many attempts it passes over, then says there are more.
_PASSED_NAMED = 5


def _codecs(t: Any) -> str:
    table = getattr(t, "table", None)
    if table is not None and t.table_ranges_untouched:
        a, b = int(table.row_start[t.index]), int(table.row_start[t.index + 1])
        return ",".join(CODECS[c] for c in sorted(set(table.codec[a:b].tolist()))) or "-"
    return ",".join(sorted({r.codec for r in t.ranges})) or "-"


def _inspect(args: argparse.Namespace) -> int:
    import portable_ckpt
    from portable_ckpt.io.annotations import read_annotations

    ck = portable_ckpt.open(args.ckpt, step=args.step)
    m = ck.manifest
    drills = read_annotations(ck.storage, ck.id, "drills")
    if args.json:
        doc: dict[str, Any] = m.to_json()
        doc["drills"] = drills
        doc["copies"] = read_annotations(ck.storage, ck.id, "copies")
        if m.tensor_table is not None:
            # Format 1.1: show the tensors the table holds, like a 1.0 manifest would.
            doc["tensors"] = {
                k: t.to_json() if args.ranges else {"dtype": t.dtype, "shape": list(t.shape),
                                                    "ranges": t.range_count}
                for k, t in m.tensors.items()
            }
        elif not args.ranges:
            for t in doc["tensors"].values():
                t["ranges"] = len(t["ranges"])
            for f in doc["files"].values():
                f["checksum"] = {k: v for k, v in f["checksum"].items() if k != "blocks"}
        print(json.dumps(doc, indent=2))
        return 0
    c = m.continuation
    mesh = f" mesh {list(c.mesh.shape)} {list(c.mesh.dim_names)}" if c.mesh else ""
    print(f"version     {safe(ck.path)}")
    print(f"step        {m.step}")
    producer = f"{m.producer.get('name')} {m.producer.get('version')}"
    print(f"format      {m.format_version} (producer {safe(producer)})")
    print(f"committed   {safe(m.committed_at)}")
    print(f"contract    {safe(c.contract)}, world size {c.world_size}{safe(mesh)}")
    total = sum(f.size for f in m.files.values())
    print(f"files       {len(m.files)} ({human_bytes(total)})")
    last = drills[-1] if drills else None
    print(
        f"drill       {'none' if last is None else ('passed' if last.get('ok') else 'failed')}"
        + (safe(f" on {last.get('world_size')} ranks at {last.get('finished_at')}") if last else "")
    )
    print()
    rows = [
        [
            k,
            t.dtype,
            str(list(t.shape)),
            str(t.range_count),
            human_bytes(t.nbytes),
            _codecs(t),
        ]
        for k, t in m.tensors.items()
    ]
    print(table(rows, ["TENSOR", "DTYPE", "SHAPE", "RANGES", "SIZE", "CODEC"]))
    if args.ranges:
        for k, t in m.tensors.items():
            for r in t.ranges:
                print(safe(
                    f"  {k} offsets={list(r.offsets)} lengths={list(r.lengths)} -> {r.file}:{r.name} ({r.codec})"
                ))
    if m.entries:
        print()
        erows = [
            [
                n,
                e.schema_id or "embedded",
                e.scope,
                e.world_size_policy or "-",
                e.encoding,
                str(len(e.values)),
            ]
            for n, e in m.entries.items()
        ]
        print(table(erows, ["ENTRY", "SCHEMA", "SCOPE", "POLICY", "ENCODING", "VALUES"]))
    return 0


def _gc(args: argparse.Namespace) -> int:
    from portable_ckpt.io.gc import gc

    if args.grace < SHORT_GRACE_SECONDS and not args.dry_run:
        print(
            f"portable-ckpt gc: --grace {args.grace:g} s: an attempt without a commit record "
            "that nothing wrote to for that long is deleted, also a save still running; use "
            "it only when no job writes to this root",
            file=sys.stderr,
        )
    with progress_bar(args, "gc: deleting", unit="attempt") as bar:
        rep = gc(
            args.root,
            keep=args.keep,
            grace_seconds=args.grace,
            dry_run=args.dry_run,
            require_copy=args.require_copy,
            progress=bar,
            delete_invalid=args.delete_invalid,
            retire_abandoned=args.retire_abandoned,
        )
    if args.json:
        print(json.dumps(rep.to_json(), indent=2))
    else:
        verb = "would delete" if args.dry_run else "deleted"
        failed = set(rep.failed_verification)
        for v in rep.deleted:
            print(f"{verb}  {v}" + ("  (--retire-abandoned)" if v in rep.retired else "")
                  + ("  (failed verification)" if v in failed else ""))
        for v in rep.newer_branch:
            print(f"kept    {v}  (committed after the latest version, at a lower step: a "
                  "rollback's new branch; --retire-abandoned makes it the latest)")
        for d in rep.retire_doubted:
            print(f"kept    {d['id']}  (--retire-abandoned: {safe(d['reason'])})")
        for v in rep.retire_pinned:
            print(f"kept    {v}  (--retire-abandoned: abandoned by a rollback, but pinned: it "
                  "stays the latest version, not the rollback's branch; unpin it first)")
        what = "no valid commit record" if args.delete_invalid else "abandoned attempt"
        for v in rep.abandoned:
            print(f"{verb}  {v}  ({what})")
        for v in rep.gone:
            print(f"gone    {v}  (deleted by another process while this gc ran)")
        for v in rep.foreign:
            print(f"kept    {v}  (foreign: written by a newer format version)")
        pins_unknown = any(u["status"] == "pins unreadable" for u in rep.unknown)
        for v in rep.pinned:
            print(f"kept    {v}  " + ("(a pin could not be read: any version may be pinned)"
                                      if pins_unknown else "(pinned)"))
        for g in rep.in_grace:
            print(
                f"kept    {g['id']}  ({g['status']}, written to {g['age_seconds']:.0f} s ago: "
                f"within the grace period of {args.grace:g} s, " + (
                    "being deleted: a gc that stopped part-way marked it; a later gc removes "
                    "it)" if g.get("being_deleted") else
                    # (--delete-invalid: a damaged version, no save; S3 review 24, L5)
                    "deleted as asked once it has passed)" if g["status"] == "invalid" else
                    # (re-attack 24, N6: what a gc killed in its last step leaves)
                    "empty: a save that wrote nothing yet, or what a stopped gc left)"
                    if g.get("empty") else "a save may be in progress)")
            )
        for d in rep.damaged:
            print(
                f"kept    {d['id']}  (damaged: its commit record is invalid: [{d['code']}] "
                f"{safe(d['message'])[:300]})"
            )
        for d in rep.left_behind:
            # (an attempt that never had a record is no version: "partly deleted", re-attack 27)
            what = ("is deleted (its commit record is gone)" if d.get("had_record", True)
                    else "(no commit record: no version) is partly deleted")
            print(f"note: {d['id']} {what}, but files of it are left: "
                  f"{safe(d['message'])[:300]}")
        if rep.clock_skew is not None:
            print(f"note: this host's clock is {abs(rep.clock_skew):.0f} s "
                  f"{'ahead of' if rep.clock_skew > 0 else 'behind'} the storage's; attempts "
                  "were dated on the storage's clock")
        for v in rep.kept_for_copy:
            where = "" if args.require_copy is True else f" on {safe(args.require_copy)}"
            print(f"kept    {v}  (--require-copy: no kept version has a verified copy{where})")
        if rep.foreign_keys:
            keys = rep.foreign_keys
            print(f"left in place {len(keys)} entries that are not this format's: "
                  f"{_foreign_urls(str(args.root), keys)} (no tool of this format deletes them; "
                  "look at them and remove them by hand where they are garbage)")
        if rep.marks_cleared:  # (maintainer review 24, 6: in --json only)
            print(f"removed {len(rep.marks_cleared)} deletion mark(s) that a gc stopped before "
                  "the commit record went left in versions this gc keeps")
        if rep.aborted_uploads:  # billed until then, and shown in --json only (S3 review 24, L2)
            print(f"aborted {rep.aborted_uploads} unfinished upload(s) (of deleted attempts, or "
                  "left by a writer killed while it uploaded a file a kept version lists)")
        if rep.pruned_records:
            pruned = "would remove" if args.dry_run else "removed"
            print(f"{pruned} {rep.pruned_records} superseded verify/copy/drill record(s) of "
                  "kept versions (the newest of each kind and every failed verification stay)")
        print(
            f"kept {len(rep.kept)}: {', '.join(rep.kept) or '-'}; protected (newest drilled/committed): {rep.protected or '-'}"
            + (f"; of the kept, failed verification (never restored): "
               f"{', '.join(v for v in rep.kept if v in failed)}"
               if failed.intersection(rep.kept) else "")
            + (f"; kept for want of a copy: {len(rep.kept_for_copy)}" if rep.kept_for_copy else "")
        )
    if not (rep.kept or rep.deleted or rep.abandoned or rep.in_grace or rep.damaged
            or rep.foreign or rep.unknown or rep.pinned or rep.gone):
        from portable_ckpt.io.versions import foreign_keys
        from portable_ckpt.storage import open_storage

        # gc applies to one root; a folder of roots (torchtitan's step-N) held no attempt
        with contextlib.suppress(CheckpointError):
            storage = open_storage(args.root)
            _child_roots(storage, foreign_keys(storage), str(args.root),
                         f"gc --keep {args.keep}", file=sys.stderr)
    for u in rep.unknown:
        what = u["id"] or ("the pins" if u["status"] == "pins unreadable" else "unfinished uploads")
        why = {"delete failed": "could not delete it", "pins unreadable": "could not read them; "
               "no version was deleted"}.get(u["status"], "could not classify it")
        print(f"portable-ckpt: skipped {what}: {why}: {safe(u['message'])}", file=sys.stderr)
    if rep.damaged:
        print(
            f"portable-ckpt: gc kept {len(rep.damaged)} attempt(s) whose commit record is "
            "invalid: committed versions damaged after their commit (a save never publishes "
            "such a record), whose data may still be recovered. `portable-ckpt verify ROOT/ID` "
            "names the record's defect. Where a copy of the version exists (`portable-ckpt ls "
            "COPY_ROOT`), copy its manifest.json over ROOT/ID/manifest.json (`cp`, or `aws s3 "
            "cp` on S3), then run `portable-ckpt verify ROOT/ID --deep`; a version whose record "
            "was lost (PCK-MANIFEST-MISSING) without a copy is rebuilt by `portable-ckpt "
            "recommit ROOT/ID` (docs/recovery.md); or delete them with --delete-invalid",
            file=sys.stderr,
        )
    if rep.committed_meanwhile:
        print(f"portable-ckpt: {len(rep.committed_meanwhile)} attempt(s) committed while gc ran "
              f"(a save's commit): kept, no problem; the next gc applies retention to them: "
              f"{safe(', '.join(rep.committed_meanwhile[:4]))}", file=sys.stderr)
    if not rep.complete:
        print(
            f"portable-ckpt: gc skipped {len(rep.unknown)} attempt(s) it could not read or "
            "delete (named above; what it deleted is listed); run it again once the cause "
            "named there is fixed (a storage that did not answer, or permissions)",
            file=sys.stderr,
        )
    if rep.kept_for_copy:  # the one thing a --require-copy cron must hear (multi-job F13)
        why = (
            "no destination holds a copy; the root grows until one is made"
            if not rep.copy_unasked else
            "a destination could not be asked whether it holds the copy ("
            + "; ".join(safe(u) for u in rep.copy_unasked[:3])
            + ("): the store did not answer; gc runs again once it does"
               if rep.copy_unasked_retryable else "): fix access to it, or make a copy elsewhere")
        )
        print(f"portable-ckpt gc: {len(rep.kept_for_copy)} version(s) kept for want of a "
              f"verified copy: {why}", file=sys.stderr)
    # What a retry may mend by itself (75): attempts it could not read or delete, files of a
    # deleted version left behind, copies it could not ask about, where the storage did not
    # answer (SRE review S5, S6); everything else needs a person (1).
    copies_unknown = bool(rep.kept_for_copy and rep.copy_unasked)
    return failed_status(
        [False] * bool(rep.damaged or rep.retire_doubted or rep.retire_pinned)
        + ([copies_unknown and rep.copy_unasked_retryable] if rep.kept_for_copy else [])
        + [u["retryable"] for u in rep.unknown]
        + [d["retryable"] for d in rep.left_behind]
    )


def register(sub: Any) -> None:
    """Add ``ls``, ``inspect`` and ``gc``."""
    p = sub.add_parser("ls", help="list the attempts of a root: committed, incomplete, invalid, foreign, unreadable or stray")
    p.add_argument("root", type=A.root_only)
    p.add_argument(
        "--latest",
        action="store_true",
        help="print only the version a restore takes: the path of the newest committed version "
        "that no verification failed; with --json, its row. Exit 1 only when there is none "
        "(start afresh); 75 when a newer attempt, or its records, could not be read for a cause "
        "that may pass (retry, never start afresh); 69 when a person must act (a permission, "
        "every version failed verification)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_ls)

    p = sub.add_parser("inspect", help="show a version's tensors, entries and contract")
    p.add_argument(
        "ckpt", type=A.root_url, help="a root (its latest committed version) or a version directory"
    )
    p.add_argument("--step", type=A.step, default=None, help="with a root: this step's newest version")
    p.add_argument("--ranges", action="store_true", help="list every range record")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_inspect)

    p = sub.add_parser("gc", help="apply retention: keep N newest and the newest drilled version")
    p.add_argument("root", type=A.root_only)
    p.add_argument("--keep", type=A.int_range(1, 10**9, "keep"), required=True)
    p.add_argument(
        "--grace",
        type=A.grace_seconds,
        default=DEFAULT_GRACE_SECONDS,
        help="seconds without activity before an attempt without a commit record is removed "
        f"(finite, >= 0; default {DEFAULT_GRACE_SECONDS:g}). A save in progress counts as activity only within this "
        "period: a grace shorter than a save's quiet spells (0 above all) deletes saves that "
        "are still running; use it only when no job writes to the root",
    )
    p.add_argument(
        "--require-copy",
        nargs="?",
        const=True,
        default=False,
        type=A.root_url,
        metavar="ROOT_URL",
        help="delete older versions only once a kept one has a verified copy on "
        "another root (on ROOT_URL when given) that is still committed there (a copy "
        "deleted since its record was written counts for nothing)",
    )
    p.add_argument(
        "--delete-invalid",
        action="store_true",
        help="also delete attempts whose commit record is invalid once the grace period has "
        "passed (by default they are kept and reported, exit 1: a save never publishes such "
        "a record, so it is a committed version damaged after its commit)",
    )
    p.add_argument(
        "--retire-abandoned",
        action="store_true",
        help="first delete (commit record first) every committed version that a later commit "
        "at the same or a lower step abandoned: after a job resumed from an older step, the "
        "first run's later steps stop being the latest (see them first with --dry-run)",
    )
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_gc)
