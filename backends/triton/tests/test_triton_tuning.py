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


@pytest.mark.parametrize(
    ("seqlen_k", "want"),
    [
        (1, ("*", "d128-full-mha", "d128-full-mha-short", "d128-full-mha-short-1k")),
        (1024, ("*", "d128-full-mha", "d128-full-mha-short", "d128-full-mha-short-1k")),
        (1025, ("*", "d128-full-mha", "d128-full-mha-short", "d128-full-mha-short-2k")),
        (2048, ("*", "d128-full-mha", "d128-full-mha-short", "d128-full-mha-short-2k")),
        (2049, ("*", "d128-full-mha", "d128-full-mha-long", "d128-full-mha-long-4k")),
        (4096, ("*", "d128-full-mha", "d128-full-mha-long", "d128-full-mha-long-4k")),
        (4097, ("*", "d128-full-mha", "d128-full-mha-long", "d128-full-mha-long-8k")),
        (8192, ("*", "d128-full-mha", "d128-full-mha-long", "d128-full-mha-long-8k")),
        (8193, ("*", "d128-full-mha", "d128-full-mha-long")),
    ],
)
def test_lookup_keys_per_length(seqlen_k: int, want: tuple) -> None:
    assert tuning.lookup_keys(128, False, 1, seqlen_k) == want


def test_sm90_mha_2k_entry_applies_only_between_1k_and_2k(cache_dir) -> None:
    """The sm_90 table's ``-2k`` entry overrides its ``-short`` one above 1K only."""
    short = tuning._TABLES["sm_90"]["d128-full-mha-short"]["dkdv"]
    two_k = tuning._TABLES["sm_90"]["d128-full-mha-short-2k"]["dkdv"]
    assert short != two_k
    for seqlen_k, want in ((512, short), (1024, short), (1536, two_k), (2048, two_k)):
        assert tuning.lookup("sm_90", 128, False, 1, tuning._bucket(seqlen_k))["dkdv"] == want
    assert (
        tuning.lookup("sm_90", 128, False, 1, tuning._bucket(4096))["dkdv"]
        == (tuning._TABLES["sm_90"]["d128-full-mha"]["dkdv"])
    )


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
    assert (
        tuning.lookup("sm_90", 128, False, 1, tuning._bucket(4096))["dkdv"]
        == (tuning._TABLES["sm_90"]["d128-full-mha"]["dkdv"])
    )


@pytest.mark.parametrize(
    ("causal", "group", "seqlen_k", "dp_first"),
    # without a mask: every group and length; causal: MHA up to 2K only
    [(False, group, seqlen_k, 1) for group in (1, 8) for seqlen_k in (1024, 2048, 8192)]
    + [(True, 1, 1024, 1), (True, 1, 2048, 1), (True, 1, 4096, 0), (True, 1, 16384, 0)]
    + [(True, 8, seqlen_k, 0) for seqlen_k in (1024, 2048, 8192)],
)
def test_sm90_dp_first_per_class(cache_dir, causal, group, seqlen_k, dp_first) -> None:
    """dP first where the H200 measured it faster (D=128 without a mask, MHA causal <= 2K); not
    with the causal 64x128 tiles; 4-stage dQ only at long lengths without a mask."""
    cfgs = tuning.lookup("sm_90", 128, causal, group, tuning._bucket(seqlen_k))
    assert cfgs["dkdv"].get("DP_FIRST", 0) == dp_first
    long_full = not causal and seqlen_k > tuning.SHORT_SEQ
    assert (cfgs["dq"]["num_stages"] == 4) == long_full


@pytest.mark.parametrize("head_dim", [64, 256])
def test_sm90_dp_first_only_where_measured(cache_dir, head_dim) -> None:
    """Head dims the H200 did not measure keep the default order."""
    for causal in (False, True):
        for seqlen_k in (1024, 2048, 8192):
            cfgs = tuning.lookup("sm_90", head_dim, causal, 1, tuning._bucket(seqlen_k))
            assert "DP_FIRST" not in cfgs["dkdv"]


@pytest.mark.parametrize(
    ("seqlen_k", "split", "heavy_first", "window", "add"),
    [(2048, 4, 1, 0, 0), (4096, 4, 0, 1, 0), (8192, 4, 0, 1, 1), (16384, 4, 0, 0, 0)],
)
def test_sm90_causal_gqa_fused_atomic_order_per_length(
    cache_dir, seqlen_k, split, heavy_first, window, add
) -> None:
    """GQA causal, fused-atomic: split 4 throughout; heaviest first at 2K, launch windows of
    one kv head at 4K and 8K (the ``-4k`` / ``-8k`` entries), the natural order at 16K; the
    slices add dK / dV by atomics at 8K only (H200 measurements in the table)."""
    cfg = tuning.lookup("sm_90", 128, True, 8, tuning._bucket(seqlen_k))["dkdvq"]
    assert (
        cfg["SPLIT"],
        cfg.get("HEAVY_FIRST", 0),
        cfg.get("WINDOW", 0),
        cfg.get("SPLIT_ADD", 0),
    ) == (split, heavy_first, window, add)


def test_trial_overrides_one_class_and_restores_it(cache_dir) -> None:
    """A trial's configs win over the table and the on-disk cache inside the block only."""
    key = "d128-causal-gqa-long-4k"
    before = tuning.lookup("sm_90", 128, True, 8, tuning._bucket(4096))
    longer = tuning.lookup("sm_90", 128, True, 8, tuning._bucket(8192))
    mine = {**before["dkdvq"], "SPLIT": 2, "WINDOW": 0}
    tuning.save_tuned("sm_90", key, {"dkdvq": {**mine, "SPLIT": 8}})
    tuned = tuning.lookup("sm_90", 128, True, 8, tuning._bucket(4096))
    with tuning.trial("sm_90", key, {"dkdvq": mine}):
        inside = tuning.lookup("sm_90", 128, True, 8, tuning._bucket(4096))
        assert inside["dkdvq"] == mine
        assert inside["dq"] == before["dq"]  # other kernels keep their configs
        assert tuning.lookup("sm_90", 128, True, 8, tuning._bucket(8192)) == longer
    assert tuning.lookup("sm_90", 128, True, 8, tuning._bucket(4096)) == tuned
    assert tuned["dkdvq"]["SPLIT"] == 8


def test_trial_with_changes_keys_of_the_entry_in_force(cache_dir) -> None:
    """``trial_with``: the shape's entry as looked up, a few keys changed, inside the block."""
    before = tuning.lookup("sm_90", 128, True, 8, tuning._bucket(8192))
    with tuning.trial_with("sm_90", "dkdvq", 128, True, 8, 8192, SPLIT_ADD=0, SPLIT=2):
        inside = tuning.lookup("sm_90", 128, True, 8, tuning._bucket(8192))
        assert inside["dkdvq"] == {**before["dkdvq"], "SPLIT_ADD": 0, "SPLIT": 2}
        assert inside["dq"] == before["dq"]
    assert tuning.lookup("sm_90", 128, True, 8, tuning._bucket(8192)) == before
