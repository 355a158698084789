"""Mutation audit 30, the recovery commands messages give (``io/hints.py``): a version path
written with a trailing slash, as shells complete directory names.

The test names the mutant it kills (the audit's ``mutants.md``).
"""

from __future__ import annotations

from portable_ckpt.io.hints import copy_back_commands


def test_copy_back_of_a_version_path_with_a_trailing_slash() -> None:
    """``copy_back_commands`` splits the version path into its root and its id after dropping
    a trailing ``/``. Mutant H01 (not dropped): ``copy`` was told to copy the copy root itself
    (an empty id) into the version directory."""
    copy, verify = copy_back_commands("/ck/root/s000000000001-x/", "/backup")
    assert copy == "portable-ckpt copy /backup/s000000000001-x /ck/root"
    assert verify == "portable-ckpt verify /ck/root/s000000000001-x/ --deep"
