"""A process forked after S3 was used (serving review F6).

obstore's runtime does not survive ``fork()``: a child forked from a process that had made an
S3 request hung on its first request, for ever, whatever the timeouts. It is told why now, at
once, with the fix; a spawned child works.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import portable_ckpt

from .conftest import S3Env

pytestmark = pytest.mark.s3

_SCRIPT = textwrap.dedent('''
    import multiprocessing as mp, sys
    import portable_ckpt

    def child(root, q):
        try:
            q.put(("ok", float(portable_ckpt.open(root).read("w")[0, 0])))
        except Exception as e:
            q.put((type(e).__name__, str(e)))

    if __name__ == "__main__":
        root, method = sys.argv[1], sys.argv[2]
        assert float(portable_ckpt.open(root).read("w")[0, 0]) == 7.0  # S3 used in the parent
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(root, q))
        p.start()
        print(q.get(timeout=60))
        p.join(timeout=60)
''')


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_forked_after_s3_was_used_is_told_why_not_left_hanging(
    s3: S3Env, tmp_path, method: str
) -> None:
    root = s3.root("fork")
    portable_ckpt.save_arrays(root, {"w": np.full((4, 4), 7.0, np.float32)}, step=1)
    script = tmp_path / "forked.py"
    script.write_text(_SCRIPT)
    res = subprocess.run([sys.executable, str(script), root, method], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ))
    assert res.returncode == 0, res.stderr[-2000:]
    if method == "spawn":
        assert res.stdout.strip() == "('ok', 7.0)"
    else:
        assert res.stdout.startswith("('UsageError', "), res.stdout
        assert "forked" in res.stdout and "'spawn'" in res.stdout
