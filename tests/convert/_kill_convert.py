"""Child process of the staging tests: ``portable-ckpt convert`` that stops at a phase.

Usage: python _kill_convert.py PHASE CONVERT-ARGS...

PHASE is where it stops: ``hub`` (the temporary portable version of an X → Y conversion is
written, its export not begun), ``publish`` (the target is staged in full, just before the
rename onto DST), ``torch-save`` (a torch export's tensors are in its scratch directory, the
staged file made, ``torch.save`` about to write it), or ``-`` (never). There it prints
``PHASE <name>`` on stdout and waits for a line on stdin: the parent kills it there (SIGKILL,
SIGTERM, SIGINT), or writes a line to let it finish. No sleeps: the kill lands at the phase.
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def pause(name: str) -> None:
    sys.stdout.write(f"PHASE {name}\n")
    sys.stdout.flush()
    sys.stdin.readline()  # the parent kills us here, or lets us go on


def main() -> int:
    phase, argv = sys.argv[1], sys.argv[2:]
    import portable_ckpt.convert as conv
    from portable_ckpt.cli.main import main as cli

    if phase == "hub":
        real_export = conv._from_portable

        def export(*a: Any, **k: Any) -> Any:
            pause(phase)
            return real_export(*a, **k)

        conv._from_portable = export  # type: ignore[assignment]
    elif phase == "publish":
        dst = os.path.abspath(argv[2])
        real_rename = os.rename

        def rename(src: Any, to: Any, *a: Any, **k: Any) -> None:
            if os.path.abspath(to) == dst:
                pause(phase)
            real_rename(src, to, *a, **k)

        os.rename = rename  # type: ignore[assignment]
    elif phase == "torch-save":
        import portable_ckpt.convert._torch_export as export_mod

        real_open = export_mod.open_staged

        def open_staged(tmp: str) -> Any:
            pause(phase)
            return real_open(tmp)

        export_mod.open_staged = open_staged
    return cli(argv)


if __name__ == "__main__":
    sys.exit(main())
