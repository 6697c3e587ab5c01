"""Configuration lookup: keys from general to specific, length buckets, the on-disk cache."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from attn_dispatch_triton import tuning  # noqa: E402


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty on-disk tuning cache for the test; lookups forget it afterwards."""
    monkeypatch.setenv("ATTN_DISPATCH_TRITON_CACHE", str(tmp_path))
    tuning._tuned.cache_clear()
    tuning.lookup.cache_clear()
    yield tmp_path
    monkeypatch.delenv("ATTN_DISPATCH_TRITON_CACHE")
    tuning._tuned.cache_clear()
    tuning.lookup.cache_clear()


@pytest.mark.parametrize(("seqlen_k", "want"), [
    (1, ("*", "d128-full-mha", "d128-full-mha-short", "d128-full-mha-short-1k")),
    (1024, ("*", "d128-full-mha", "d128-full-mha-short", "d128-full-mha-short-1k")),
    (1025, ("*", "d128-full-mha", "d128-full-mha-short", "d128-full-mha-short-2k")),
    (2048, ("*", "d128-full-mha", "d128-full-mha-short", "d128-full-mha-short-2k")),
    (2049, ("*", "d128-full-mha", "d128-full-mha-long")),
])
def test_lookup_keys_per_length(seqlen_k: int, want: tuple) -> None:
    assert tuning.lookup_keys(128, False, 1, seqlen_k) == want


def test_sm90_mha_2k_entry_applies_only_between_1k_and_2k(cache_dir) -> None:
    """The sm_90 table's ``-2k`` entry overrides its ``-short`` one above 1K only."""
    short = tuning._TABLES["sm_90"]["d128-full-mha-short"]["dkdv"]
    two_k = tuning._TABLES["sm_90"]["d128-full-mha-short-2k"]["dkdv"]
    assert short != two_k
    for seqlen_k, want in ((512, short), (1024, short), (1536, two_k), (2048, two_k)):
        assert tuning.lookup("sm_90", 128, False, 1, tuning._bucket(seqlen_k))["dkdv"] == want
    assert tuning.lookup("sm_90", 128, False, 1, tuning._bucket(4096))["dkdv"] == (
        tuning._TABLES["sm_90"]["d128-full-mha"]["dkdv"])


def test_tuned_entry_overrides_the_table_for_its_bucket_only(cache_dir) -> None:
    mine = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 2, "num_stages": 1}
    before = tuning.lookup("sm_90", 64, True, 4, tuning._bucket(4096))
    path = tuning.save_tuned("sm_90", tuning.shape_class(64, True, 4, 512), {"dq": mine})
    assert path.parent == cache_dir and path.exists()
    assert tuning.lookup("sm_90", 64, True, 4, tuning._bucket(512))["dq"] == mine
    assert tuning.lookup("sm_90", 64, True, 4, tuning._bucket(2048))["dq"] == mine
    assert tuning.lookup("sm_90", 64, True, 4, tuning._bucket(4096)) == before
    # the other kernels of the tuned class keep the table's choice
    assert tuning.lookup("sm_90", 64, True, 4, tuning._bucket(512))["dkdv"] == before["dkdv"]


def test_unreadable_cache_file_falls_back_to_the_table(cache_dir) -> None:
    tuning.cache_path("sm_90").write_text("{not json")
    assert tuning.lookup("sm_90", 128, False, 1, tuning._bucket(4096))["dkdv"] == (
        tuning._TABLES["sm_90"]["d128-full-mha"]["dkdv"])
