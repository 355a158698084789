"""What importing the core costs: no torch, and no ml_dtypes until a bfloat16/float8 is touched.

Each check runs in a fresh interpreter (``sys.modules`` of the test process is shared by every
test). ml_dtypes' import costs ~1.4 s of CPU on the CI machines: paid by every CLI call and
every spawned rank while it was imported eagerly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "src")


def _run(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("module", ["portable_ckpt", "portable_ckpt.cli"])
def test_core_imports_neither_torch_nor_ml_dtypes(module: str) -> None:
    got = _run(f"""
        import sys, importlib
        importlib.import_module({module!r})
        print(sorted(m for m in ("torch", "ml_dtypes") if m in sys.modules))
    """)
    assert got.strip() == "[]"


def test_bfloat16_and_float8_resolve_on_first_use() -> None:
    got = _run("""
        import sys
        import numpy as np
        import portable_ckpt as pc
        from portable_ckpt.format.dtypes import DTYPES, numpy_dtype
        before = "ml_dtypes" in sys.modules
        assert DTYPES["bfloat16"].itemsize == 2 and DTYPES["float8_e5m2"].itemsize == 1
        assert "ml_dtypes" not in sys.modules  # the table's sizes need no import
        bf16 = numpy_dtype("bfloat16")
        assert "ml_dtypes" in sys.modules  # resolved on first use
        import ml_dtypes
        assert bf16 == np.dtype(ml_dtypes.bfloat16)
        from portable_ckpt.format.dtypes import dtype_name
        assert dtype_name(ml_dtypes.float8_e4m3fn) == "float8_e4m3fn"
        assert dtype_name(np.float32) == "float32"
        print(before)
    """)
    assert got.strip() == "False"


def test_bfloat16_round_trip_in_a_fresh_process(tmp_path: object) -> None:
    """A reader that never imported ml_dtypes itself gets bfloat16 arrays back exactly."""
    root = os.path.join(str(tmp_path), "ck")
    _run(f"""
        import ml_dtypes, numpy as np
        import portable_ckpt as pc
        x = (np.arange(12, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16).reshape(3, 4)
        pc.save_arrays({root!r}, {{"x": x}}, step=1)
        np.save({root!r} + ".npy", x.view(np.uint16))
    """)
    got = _run(f"""
        import numpy as np
        import portable_ckpt as pc
        arr = pc.open({root!r}).read("x")
        want = np.load({root!r} + ".npy")
        assert arr.dtype.name == "bfloat16", arr.dtype
        assert (arr.view(np.uint16) == want).all()
        print("ok")
    """)
    assert got.strip() == "ok"


def test_the_cli_module_and_the_package_top_import_no_numpy() -> None:
    """Ops review F15: a Ctrl-C in the CLI's start-up printed a traceback.

    ``main`` catches the interruption once it runs; what comes before it (the package's top and
    ``portable_ckpt.cli.main``) stays light, so the window is Python's own start-up.
    """
    got = _run("""
        import sys
        import portable_ckpt, portable_ckpt.cli.main
        print(sorted(m for m in ("numpy", "jsonschema", "portable_ckpt.format.manifest")
                     if m in sys.modules))
        print(portable_ckpt.FORMAT_VERSION, portable_ckpt.Manifest.__name__)  # still exported
    """)
    assert got.splitlines() == ["[]", "1.0 Manifest"]


def test_a_ctrl_c_while_the_cli_starts_exits_130_without_a_traceback(tmp_path: object) -> None:
    """A real SIGINT, delivered while the commands' modules are being imported."""
    code = textwrap.dedent(f"""
        import importlib, os, signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even
        # when the test runner was started with SIGINT ignored (a background job)
        import portable_ckpt.cli.main as cli
        real = importlib.import_module
        def interrupted(name, *args):
            if name.endswith(".cmd_core"):
                os.kill(os.getpid(), signal.SIGINT)  # the handler runs on the next bytecode
            return real(name, *args)
        importlib.import_module = interrupted
        sys.exit(cli.main(["ls", {str(tmp_path)!r}]))
    """)
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120, check=False)
    assert p.returncode == 130, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and p.stdout == "", p.stderr
