"""The storage contract (portable_ckpt.testing.storage.StorageTests) on S3: a real moto server."""

from __future__ import annotations

import pytest

from portable_ckpt.storage.s3 import S3Storage
from portable_ckpt.testing.storage import StorageTests

from .conftest import S3Env

pytestmark = pytest.mark.s3


class TestS3Storage(StorageTests):
    @pytest.fixture
    def store(self, s3: S3Env) -> S3Storage:
        return S3Storage.from_url(s3.root("contract"))
