"""The public API's small misuses the API review 31 left open, refused at the call.

Each was taken (and did something else than the caller meant) or failed below the call with
Python's own error: an entry's non-string dict keys read back as strings, a seed without a
sample ignored, ``new_attempt_id(now="x")``, ``unflatten_keys([...])`` and
``register_format(None)`` an ``AttributeError``, ``split_key(5)`` a ``TypeError``, and
``list_versions`` of a mistyped root ``[]`` (a root without versions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main
from portable_ckpt.errors import NotFoundError, UsageError, ValueNotJsonError
from portable_ckpt.format.keys import split_key, unflatten_keys
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage

W = np.arange(6.0)


@pytest.mark.parametrize(
    ("value", "where", "reads_as"),
    [
        ({1.5: "a"}, "at the top", '"1.5"'),
        ({1: "a"}, "at the top", '"1"'),
        ({True: "a"}, "at the top", '"true"'),
        ({None: "a"}, "at the top", '"null"'),
        ({"x": [{2: "b"}]}, r"at \['x'\]\[0\]", '"2"'),
        ({"x": ({"y": {3: 1}},)}, r"at \['x'\]\[0\]\['y'\]", '"3"'),
    ],
)
def test_an_entry_dict_key_that_is_no_string_is_refused(
    tmp_path: Path, value: Any, where: str, reads_as: str
) -> None:
    """``{1.5: "a"}`` was stored as ``{"1.5": "a"}`` and read back so, without a word."""
    root = tmp_path / "root"
    with pytest.raises(ValueNotJsonError, match=f"entry 'e': dict key .* {where} would read "
                       f"back as the string {reads_as}") as ei:
        portable_ckpt.save_arrays(root, {"w": W}, step=1, entries={"e": value})
    assert ei.value.code == "PCK-USAGE"
    assert not [p for p in root.rglob("*") if p.is_file()]  # no file written, none committed
    w = ShardWriter(open_storage(tmp_path / "w", create=True), new_attempt_id(1), 0)
    with pytest.raises(ValueNotJsonError, match="would read back as the string"):
        w.add_entry("e", value)
    w.abort(dirs=True)


def test_string_keys_lists_and_tuples_still_round_trip(tmp_path: Path) -> None:
    value = {"a": {"b": [1, {"c": None}]}, "t": (1, 2), "": {"~/": True}}
    portable_ckpt.save_arrays(tmp_path, {"w": W}, step=1, entries={"e": value})
    assert portable_ckpt.open(tmp_path).entry("e") == {
        "a": {"b": [1, {"c": None}]}, "t": [1, 2], "": {"~/": True}}


def test_a_seed_without_a_sample_or_a_sample_with_deep_is_refused(tmp_path: Path) -> None:
    """``verify(seed=3)`` ran a metadata verification and ignored the seed; ``deep=True,
    sample=0.5`` a deep one and ignored the sample (the CLI refuses both)."""
    portable_ckpt.save_arrays(tmp_path, {"w": W}, step=1)
    ck = portable_ckpt.open(tmp_path)
    with pytest.raises(UsageError, match="verify: seed draws the sample's range records: it "
                       "needs sample="):
        ck.verify(seed=3)
    with pytest.raises(UsageError, match="verify: seed"):
        ck.verify(deep=True, seed=3)
    with pytest.raises(UsageError, match="give deep=True or sample=, not both"):
        ck.verify(deep=True, sample=0.5)
    assert ck.verify(sample=0.5, seed=3) == [] and ck.verify(deep=True) == []


def test_cli_verify_with_a_sample_and_a_deep_pass_still_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI draws a seed for every run; it passes it to a sampled verification only."""
    portable_ckpt.save_arrays(tmp_path, {"w": W}, step=1)
    for argv in ([], ["--deep"], ["--sample", "0.5"], ["--sample", "1", "--seed", "4"]):
        assert cli_main(["verify", str(tmp_path), "--no-record", *argv]) == 0, argv
    assert "seed 4" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: new_attempt_id(1, now="x"),  # type: ignore[arg-type]
         "new_attempt_id: now must be a datetime.datetime .* got str 'x'"),
        (lambda: unflatten_keys([("a", 1)]),  # type: ignore[arg-type]
         r"unflatten_keys: flat must be a dict \(flat key → value\), got list"),
        (lambda: unflatten_keys({5: 1}),  # type: ignore[dict-item]
         "unflatten_keys: flat's keys must be flat keys \\(str\\), got int 5"),
        (lambda: split_key(5),  # type: ignore[arg-type]
         r"split_key: key must be a flat key \(a str such as 'model/fc.weight'\), got int 5"),
    ],
)
def test_helpers_given_the_wrong_kind_say_which_argument(call: Any, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        call()


def test_register_format_refuses_no_format() -> None:
    from portable_ckpt.convert import FORMATS, Format, register_format

    before = dict(FORMATS)
    with pytest.raises(UsageError, match=r"register_format: fmt must be a "
                       r"portable_ckpt\.convert\.Format, got NoneType None"):
        register_format(None)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="register_format: replace must be True or False"):
        register_format(Format(name="x-api32", help="h"), replace="no")  # type: ignore[arg-type]
    assert FORMATS == before


def test_the_helpers_still_work() -> None:
    import datetime as dt

    when = dt.datetime(2026, 12, 6, 1, 2, 3, 4, tzinfo=dt.UTC)
    assert new_attempt_id(7, now=when).startswith("s000000000007-20261206T010203000004Z-")
    assert split_key("a/b~1c") == ["a", "b/c"]
    assert unflatten_keys({"a/b": 1, "a/c": 2}) == {"a": {"b": 1, "c": 2}}


def test_list_versions_of_a_missing_root_is_not_found_as_ls_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``list_versions`` of a mistyped root returned ``[]``, as if it were empty, where
    ``portable-ckpt ls`` exits 1 and ``open``/``latest`` raise PCK-NOT-FOUND."""
    missing = tmp_path / "typo"
    with pytest.raises(NotFoundError, match=f"root {missing} does not exist") as ei:
        portable_ckpt.list_versions(missing)
    assert ei.value.code == "PCK-NOT-FOUND"
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotFoundError, match="is not a directory"):
        portable_ckpt.list_versions(tmp_path / "file")
    assert portable_ckpt.list_versions(missing, missing_ok=True) == []
    assert cli_main(["ls", str(missing)]) == 1
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    assert portable_ckpt.list_versions(tmp_path / "empty") == []  # exists: no versions
    portable_ckpt.save_arrays(tmp_path / "empty", {"w": W}, step=1)
    assert [v.step for v in portable_ckpt.list_versions(tmp_path / "empty")] == [1]
    with pytest.raises(UsageError, match="list_versions: missing_ok must be True or False"):
        portable_ckpt.list_versions(missing, missing_ok="yes")  # type: ignore[arg-type]


def test_verify_of_a_version_whose_records_are_a_file_says_what_it_means(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``verify VERSION --no-record`` with ``verifications`` a regular file exits 0: its bytes
    verify, which is what it was asked (nothing was to be recorded; ``verify ROOT`` and
    ``--all`` count such a version as a problem of the root). The warning now says what the
    unread records mean (a restore stops at the version), and ``--json`` names them."""
    portable_ckpt.save_arrays(tmp_path, {"w": W}, step=1)
    (version,) = [p for p in tmp_path.iterdir() if p.name.startswith("s0")]
    (version / "verifications").write_text("x")
    assert cli_main(["verify", str(version), "--no-record"]) == 0
    err = capsys.readouterr().err
    assert "verifications is no directory" in err
    assert "a restore stops at this version and `ls` shows it unreadable" in err
    assert cli_main(["verify", str(version), "--no-record", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True
    assert [e["code"] for e in doc["records_unreadable"]] == ["PCK-STORAGE"]
    assert "verifications is no directory" in doc["records_unreadable"][0]["message"]
    assert cli_main(["verify", str(tmp_path), "--no-record"]) == 1  # the root's problem
    assert cli_main(["verify", str(version), "--deep"]) == 1  # the record asked for: not stored
