"""Interpreter exit with ``async_save(mode="process")`` in flight to an S3 endpoint that does not
answer: ABANDONED at ``exit_timeout``, the writer process ends too, step 1 stays the latest."""

from __future__ import annotations

import pytest

from tests.torch.test_async_exit import assert_abandoned_at_the_bound, exit_with_save_in_flight

from .conftest import S3Env

pytestmark = [pytest.mark.s3, pytest.mark.torch]


def test_process_mode_save_to_a_stalled_endpoint_is_abandoned(s3_proxied: S3Env) -> None:
    pytest.importorskip("torch")
    proxy = s3_proxied.proxy
    # Step 2's uploads reach the proxy, which sits on them (far past the bound). The bound leaves
    # the writer process time to start and reach its first upload on a loaded CI machine (with
    # 1 s it sometimes had not uploaded anything yet when the bound ran out).
    proxy.match_method, proxy.match_path = "PUT", r"/s000000000002-"
    proxy.delay_every, proxy.delay_s = 1, 60.0
    root = s3_proxied.root("run")
    code, err, took = exit_with_save_in_flight(root, delay=0, bound=8.0, mode="process")
    assert proxy.log.injected_delays >= 1  # the writer process's upload was the one stalled
    # Nothing of step 2 reached the bucket: there is no incomplete attempt to list on S3.
    assert_abandoned_at_the_bound(code, err, took, root, files_left=False, bound=8)
