"""Mutation audit 29 (S3 backend): the bounds of a paginated listing (``_list_pages``).

Real pagination of the moto server (the fault proxy asks for pages of one key), with chosen
pages emptied by the proxy, as S3 answers pages of skipped delete markers or expired keys.
"""

from __future__ import annotations

import pytest

from portable_ckpt.errors import StorageError
from portable_ckpt.storage.s3 import S3Storage

from .conftest import S3Env

pytestmark = pytest.mark.s3


def test_empty_pages_are_counted_in_a_row_not_in_all(s3_proxied: S3Env) -> None:
    """``list_max_empty_pages`` bounds a run of empty "more to come" pages: an entry between
    two empty pages starts the count again (mutant N04 counted every empty page of the
    listing, and a long real listing with scattered empty pages failed)."""
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01, list_max_empty_pages=2)
    for name in "abcde":
        st.put(f"v/{name}", b"1")
    proxy = s3_proxied.proxy
    proxy.match_path, proxy.list_page_size = r"list-type=2", 1
    # pages 2 and 4 (keys b and d) come back empty but truncated
    proxy.body_subs = [(rb"<Contents>\s*<Key>ckpts/v/[bd]</Key>[\s\S]*?</Contents>", b"")]
    assert [i.path for i in st.list("v")] == ["v/a", "v/c", "v/e"]
    assert st.stats.other_requests == 5  # one page a key: the emptied pages were asked for


def test_recursive_listings_are_not_kept_by_one_root_listing(s3: S3Env) -> None:
    """Only directory levels (delimited listings) are kept within ``one_root_listing``: a
    recursive listing asks again, and is never taken for the level of the same prefix
    (mutant V10 kept it under the level's key: ``list_dirs`` then found no directory, and a
    second recursive listing missed an object written meanwhile)."""
    st = S3Storage.from_url(s3.root())
    st.put("v/a/x", b"1")
    with st.one_root_listing():
        assert [i.path for i in st.list("v")] == ["v/a/x"]
        assert st.list_dirs("v") == ["a"]
        st.put("v/b/y", b"2")
        assert [i.path for i in st.list("v")] == ["v/a/x", "v/b/y"]


def test_an_entry_outside_the_prefix_asked_for_is_foreign(s3_proxied: S3Env) -> None:
    """A listing answer naming a key outside the prefix it was asked for (a broken or hostile
    store) is foreign: never an object of this root that gc might delete (mutant P14 listed
    ``other/v/a`` as the object ``other/v/a``)."""
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    st.put("v/a", b"1")
    st.put("v/b", b"2")
    proxy = s3_proxied.proxy
    proxy.match_path = r"list-type=2"
    proxy.body_subs = [(rb"<Key>ckpts/v/a</Key>", b"<Key>other/v/a</Key>")]
    assert [i.path for i in st.list("v")] == ["v/b"]
    assert st.list_foreign("v") == ["other/v/a"]


def test_a_listing_of_exactly_list_max_keys_entries_is_complete(s3_proxied: S3Env) -> None:
    """The key bound is "more than": 5 keys list with ``list_max_keys=5`` (mutant N01 failed
    a listing that held exactly the bound)."""
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01, list_max_keys=5)
    for i in range(5):
        st.put(f"v/{i}", b"1")
    assert len(list(st.list("v"))) == 5
    st.put("v/5", b"1")
    with pytest.raises(StorageError, match="more than 5 entries"):
        list(st.list("v"))


def test_fresh_listing_asks_again_inside_one_root_listing(s3: S3Env) -> None:
    """Within ``one_root_listing`` a level is listed once; within ``fresh_listing`` it is asked
    for again (mutant V15 kept the pages: a directory written meanwhile was not seen)."""
    st = S3Storage.from_url(s3.root())
    st.put("a/x", b"1")
    with st.one_root_listing():
        assert st.list_dirs("") == ["a"]
        st.put("b/x", b"1")
        assert st.list_dirs("") == ["a"]  # kept
        with st.fresh_listing():
            assert st.list_dirs("") == ["a", "b"]
