"""Conformance suite of the portable-ckpt format (spec/README.md), 1.x (``spec.FORMAT_VERSIONS``).

Run as ``python -m conformance``: ``check`` validates a checkpoint statically, ``writer`` drives a
third-party writer through the adapter protocol described in ``conformance/README.md``.

The checker deliberately does not import :mod:`portable_ckpt`: its parsing, coverage and checksum
logic is written independently so that it catches the reference implementation's bugs instead of
sharing them.
"""

from __future__ import annotations

__all__ = ["__version__"]

#: MAJOR.MINOR is the newest format version the suite checks (``conformance.spec.FORMAT_VERSIONS``,
#: held to it by ``conformance/tests/test_cli.py``); a literal, as hatchling reads it from this file.
__version__ = "1.3.2"
