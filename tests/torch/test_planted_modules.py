"""A module planted in the working directory does not run in the library's own processes.

Tenant review F1: the process-mode writer (``python -m``) and run_group's fork server
(``python -c``) put the working directory first on ``sys.path``: a ``numpy.py`` there, in a
directory another user can write, ran inside them as the trainer. A training script run as
``python train.py`` does not import from its working directory; neither do they now.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]

_PLANT = "import pathlib; pathlib.Path({marker!r}).write_text('ran'); raise ImportError('planted')\n"

_WRITER = textwrap.dedent("""
    import torch
    import portable_ckpt.torch as pckt
    h = pckt.async_save({"w": torch.arange(4.0)}, "ck", step=1, mode="process",
                        continuation="statistical")
    print(h.result(timeout=120).step)
""")

_GROUP = textwrap.dedent("""
    from portable_ckpt.torch.launch import run_group
    if __name__ == "__main__":
        res = run_group("operator:add", 2, (), timeout=120)
        res.raise_for_errors()
        print(len(res.results))
""")


@pytest.mark.parametrize(("name", "script", "expect"), [("writer", _WRITER, "1"),
                                                        ("group", _GROUP, "2")])
def test_a_planted_module_in_the_working_directory_does_not_run(
    tmp_path: Path, name: str, script: str, expect: str
) -> None:
    work = tmp_path / "shared"
    work.mkdir()
    marker = tmp_path / "planted-ran"
    (work / "numpy.py").write_text(_PLANT.format(marker=str(marker)))
    (tmp_path / "main.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("PYTHONSAFEPATH", None)
    res = subprocess.run([sys.executable, str(tmp_path / "main.py")], cwd=work, env=env,
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == expect
    assert not marker.exists(), f"the planted module ran in the {name} process"
