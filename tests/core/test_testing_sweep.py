"""The randomized conformance sweep (attn_dispatch.testing.sweep) on the test plugins."""

import json
import os
import random
import subprocess
import sys
from collections import Counter

import pytest
import torch

from attn_dispatch.testing import sweep

SMALL = dict(longest=24, largest_head_dim=32)


def test_the_same_seed_draws_the_same_cases_and_another_seed_others() -> None:
    first, again = sweep.draw_cases(30, seed=11, **SMALL), sweep.draw_cases(30, seed=11, **SMALL)
    assert [c.describe() for c in first] == [c.describe() for c in again]
    other = sweep.draw_cases(30, seed=12, **SMALL)
    assert [c.describe() for c in first] != [c.describe() for c in other]


def test_the_distribution_covers_what_it_promises() -> None:
    drawn = sweep.draw_cases(800, seed=3)
    cases = [d.case for d in drawn]
    groups = {c.heads // c.kv_heads for c in cases}
    assert 1 in groups and len(groups) == sweep.POOL_GROUPS
    assert {c.causal_align for c in cases if c.causal} == {"top_left", "bottom_right"}
    assert any(c.head_dim % 8 for c in cases) and any(c.head_dim != c.dv for c in cases)
    dims = {c.head_dim for c in cases}
    assert 128 in dims and len(dims & set(sweep.COMMON_HEAD_DIMS)) == sweep.POOL_COMMON
    assert len(dims) == sweep.POOL_COMMON + sweep.OTHER_HEAD_DIMS + 1 == 4
    # other seeds, other head dims and groups: every multiple of 8 up to 256 (the common head
    # dims among them) and every group 1-16 within a few runs
    runs = [sweep.draw_cases(60, seed) for seed in range(160)]
    seen = {c.case.head_dim for run in runs for c in run}
    assert seen >= set(range(8, 257, 8)) | set(sweep.COMMON_HEAD_DIMS)
    assert {c.case.heads // c.case.kv_heads for run in runs for c in run} == set(range(1, 17))
    assert any(1 in c.seqlens_q for c in cases) and any(c.window for c in cases)
    assert any(c.softcap for c in cases) and any(c.varlen and 0 in c.seqlens_q for c in cases)
    assert 0.1 < sum(c.sinks for c in cases) / len(cases) < 0.2
    assert any(c.sinks and (c.window or c.softcap or c.varlen) for c in cases)
    assert any(not c.varlen and c.seqlens_q != c.seqlens_k for c in cases)
    assert any(d.deterministic for d in drawn)
    assert {d.dtype for d in drawn} == {torch.bfloat16, torch.float16}
    assert all(
        c.heads * sum(a * b for a, b in zip(c.seqlens_q, c.seqlens_k)) <= sweep.MAX_SCORES
        for c in cases
    )


def test_a_run_draws_its_gqa_groups_from_a_pool_of_group_1_and_two_others() -> None:
    rng = random.Random(5)
    pools = [sweep.group_pool(rng, 16) for _ in range(50)]
    assert all(p[0] == 1 and len(p) == 3 and set(p) <= set(range(1, 17)) for p in pools)
    assert sweep.group_pool(rng, 2) == (1, 2) and sweep.group_pool(rng, 1) == (1,)
    with pytest.raises(ValueError, match="max_group"):
        sweep.group_pool(rng, 0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_pools_keep_a_run_to_fewer_kernel_variants_than_wider_ones(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each compile group, and for FlashAttention-4 each GQA group within it, compiles its own
    kernels: the pools bound how many a run of 300 cases compiles."""

    def variants() -> tuple[int, int]:
        drawn = sweep.draw_cases(300, seed)
        pairs = {(d.compile_group, d.case.heads // d.case.kv_heads) for d in drawn}
        return len({d.compile_group for d in drawn}), len(pairs)

    groups, pairs = variants()
    monkeypatch.setattr(sweep, "POOL_COMMON", 3)
    monkeypatch.setattr(sweep, "OTHER_HEAD_DIMS", 2)
    monkeypatch.setattr(sweep, "POOL_GROUPS", 16)
    wider_groups, wider_pairs = variants()
    assert groups < wider_groups and pairs < wider_pairs


@pytest.mark.parametrize("seed", [1, 2471031134])
def test_a_run_draws_each_pair_of_head_dims_in_one_dtype_and_one_unequal_pair(seed: int) -> None:
    """A kernel compiles a variant per head-dim pair and dtype: a run keeps one dtype per pair,
    and its Dv != D cases to one pair, while seeds cover both dtypes and other pairs."""
    drawn = sweep.draw_cases(300, seed)
    dtypes: dict[tuple[int, int], set] = {}
    for d in drawn:
        dtypes.setdefault((d.case.head_dim, d.case.dv), set()).add(d.dtype)
    assert all(len(kinds) == 1 for kinds in dtypes.values()), dtypes
    assert len([pair for pair in dtypes if pair[0] != pair[1]]) == 1
    runs = [sweep.draw_cases(60, s) for s in range(20)]
    assert {d.dtype for run in runs for d in run if d.case.head_dim == 128} == {
        torch.bfloat16,
        torch.float16,
    }
    assert (
        len({(d.case.head_dim, d.case.dv) for r in runs for d in r if d.case.dv != d.case.head_dim})
        > 10
    )


def test_the_distribution_draws_strided_views_of_every_tensor() -> None:
    """q, k, v, out, grad_out and lse with a last-dim stride of 2 in some cases; sinks and
    cu_seqlens as stride-2 views in some of the cases that have them; from a stream of their
    own, so the rest of each case is what it was."""
    drawn = [d for seed in range(4) for d in sweep.draw_cases(200, seed)]
    cases = [d.case for d in drawn]
    share = sum(c.layout == "strided" for c in cases) / len(cases)
    assert abs(share - sweep.STRIDED_LAYOUT) < 0.04
    having = [c for c in cases if c.sinks or c.varlen]
    share = sum(c.strided_vectors for c in having) / len(having)
    assert abs(share - sweep.STRIDED_VECTORS) < 0.08
    assert not any(c.strided_vectors for c in cases if not (c.sinks or c.varlen))
    assert any(c.strided_vectors and c.sinks for c in cases)
    assert any(c.strided_vectors and c.varlen for c in cases)
    again = [d for seed in range(4) for d in sweep.draw_cases(200, seed)]
    assert [d.describe() for d in again] == [d.describe() for d in drawn]


def _a_case_with_strided_vectors():
    for drawn in sweep.draw_cases(200, seed=6, **SMALL):
        if drawn.case.strided_vectors and drawn.case.sinks and drawn.case.varlen:
            return drawn
    raise AssertionError("no case with strided sinks and cu_seqlens drawn")


def test_strided_vectors_hold_the_values_of_contiguous_ones() -> None:
    import dataclasses

    drawn = _a_case_with_strided_vectors()
    strided = drawn.case.make_inputs(drawn.dtype)
    plain = dataclasses.replace(drawn.case, strided_vectors=False).make_inputs(drawn.dtype)
    for name in ("sinks", "cu_seqlens_q", "cu_seqlens_k"):
        view, dense = getattr(strided, name), getattr(plain, name)
        assert view.stride() == (2,) and torch.equal(view, dense), name
    assert torch.equal(strided.q, plain.q) and "-svec" in drawn.case.id


def test_a_case_with_strided_vectors_is_checked_like_any_other(toys) -> None:
    drawn = _a_case_with_strided_vectors()
    report = sweep.run([drawn], device="cpu", names=["exact:oracle"])
    assert report.counts["exact:oracle"] == {"ok": 1, "refused": 0, "wrong": 0, "crashed": 0}, (
        report.wrong
    )


def test_a_compile_group_holds_the_cases_that_share_kernel_variants() -> None:
    import dataclasses

    one = sweep.draw_cases(1, seed=5)[0]
    longer = dataclasses.replace(one.case, seqlens_q=(77,), seqlens_k=(77,), seed=1)
    assert dataclasses.replace(one, case=longer).compile_group == one.compile_group
    other_dtype = torch.float16 if one.dtype == torch.bfloat16 else torch.bfloat16
    assert dataclasses.replace(one, dtype=other_dtype).compile_group != one.compile_group
    for change in (
        dict(head_dim_v=one.case.dv + 8),
        dict(causal=not one.case.causal),
        dict(sinks=not one.case.sinks),
        dict(softcap=None if one.case.softcap else 20.0),
    ):
        changed = dataclasses.replace(one, case=dataclasses.replace(one.case, **change))
        assert changed.compile_group != one.compile_group, change


def test_correct_implementations_pass_and_wrong_ones_are_named_with_the_seed(toys) -> None:
    cases = sweep.draw_cases(4, seed=5, **SMALL)
    report = sweep.run(cases, device="cpu", names=["exact:oracle", "toy:nondet", "toy:fast"])
    assert report.counts["exact:oracle"] == {"ok": 4, "refused": 0, "wrong": 0, "crashed": 0}
    assert report.counts["toy:nondet"]["wrong"] > 0  # fills every output with its tag
    # toy:fast refuses head dims over 64 and is wrong wherever it runs; deterministic cases
    # refuse the non-deterministic toy
    assert sum(report.counts["toy:fast"].values()) == 4
    assert report.counts[sweep.AUTO]["ok"] + report.counts[sweep.AUTO]["wrong"] == 4
    assert report.total_wrong == len(report.wrong) > 0
    assert all("seed=5 case#" in w for w in report.wrong)
    assert "exact:oracle" in report.table() and "seed=5" in report.table()


def test_a_refusal_is_counted_not_failed(toys) -> None:
    (drawn,) = [d for d in sweep.draw_cases(40, seed=8, **SMALL) if d.deterministic][:1]
    report = sweep.run([drawn], device="cpu", names=["toy:nondet"])
    assert report.counts["toy:nondet"] == {"ok": 0, "refused": 1, "wrong": 0, "crashed": 0}


def test_an_error_in_an_accepted_case_counts_as_wrong(toys, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(sweep, "check_backward", broken)
    started = []
    drawn = sweep.draw_cases(1, seed=2, **SMALL)[0]
    report = sweep.Report(seed=2)
    sweep.check_all(drawn, ["exact:oracle"], torch.device("cpu"), report, started.append)
    assert report.counts["exact:oracle"]["wrong"] == 1 and "kernel exploded" in report.wrong[0]
    assert started == [f"exact:oracle on {drawn.describe()}"]


def test_a_device_fault_is_charged_to_the_check_that_ran_and_ends_the_run(
    toys, monkeypatch
) -> None:
    # A CPU cannot fault asynchronously: the fault is injected where the sweep asks the device,
    # after the second implementation's check of the first case.
    asked = []

    def fault_on_second(device):
        asked.append(device)
        return "AcceleratorError: an illegal memory access" if len(asked) == 2 else None

    monkeypatch.setattr(sweep, "device_fault", fault_on_second)
    names = ["exact:oracle", "toy:nondet", "toy:fast"]
    report = sweep.run(sweep.draw_cases(3, seed=5, **SMALL), device="cpu", names=names)
    assert report.cases == 1 and len(asked) == 2  # nothing ran after the fault
    assert report.counts["toy:nondet"]["crashed"] == 1
    assert report.crashed and report.total_wrong >= 1
    assert "toy:nondet crashed on seed=5 case#0" in report.wrong[-1]
    assert "illegal memory access" in report.wrong[-1]
    merged = sweep.merge([report.to_dict(), report.to_dict()])
    assert merged.counts["toy:nondet"]["crashed"] == 2


def test_a_cpu_device_never_reports_a_fault() -> None:
    assert sweep.device_fault(torch.device("cpu")) is None


def test_the_command_line_reports_shards_and_merges_them(toys, tmp_path, capsys) -> None:
    parts = []
    for shard in ("0/2", "1/2"):
        path = tmp_path / f"{shard[0]}.json"
        args = ["--cases", "3", "--seed", "4", "--device", "cpu", "--longest", "16"]
        sweep.main([*args, "--shard", shard, "--json", str(path), "--quiet"])
        parts.append(str(path))
    assert sum(json.loads(open(p).read())["cases"] for p in parts) == 3
    status = sweep.main(["--merge", *parts])
    out = capsys.readouterr().out
    assert "sweep seed=4: 3 cases," in out and "exact:oracle" in out
    assert status == 1  # the toys are wrong wherever they run


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("python -m attn_dispatch.testing.sweep: error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shard", "2/2"], "argument --shard: expected i/n with 0 <= i < n"),
        (["--shard", "abc"], "argument --shard: expected i/n with 0 <= i < n"),
        (["--shard", "1"], "argument --shard: expected i/n with 0 <= i < n"),
        (["--shard", "1/2/3"], "argument --shard: expected i/n with 0 <= i < n"),
        (["--device", "bogus"], "argument --device: expected cpu or cuda[:N], got 'bogus'"),
        (["--longest", "1"], "argument --longest: expected an integer >= 2, got 1"),
        (["--cases", "-1"], "argument --cases: expected an integer >= 0, got -1"),
        # a case's seed must fit torch's; drawing is done up front (a huge index never ended)
        (["--seed", "20000000000000"], "argument --seed: expected an integer <= 4294967295"),
        (["--seed", "-3"], "argument --seed: expected an integer >= 0, got -3"),
        (["--case", "100000000000"], "argument --case: expected an integer <= 100000"),
        (["--cases", "100000000000"], "argument --cases: expected an integer <= 100000"),
        (
            ["--cases", "0", "--json", "/no/such/dir/x.json"],
            "--json: the directory '/no/such/dir' does not",
        ),
    ],
)
def test_a_bad_argument_is_one_line_and_status_2(capsys, argv, message) -> None:
    with pytest.raises(SystemExit) as exit:
        sweep.main(argv)
    assert exit.value.code == 2
    assert message in _one_error_line(capsys)


REPORT = sweep.Report(seed=1, cases=1, counts={"a:b": {"ok": 1, "refused": 0, "wrong": 0}})
MERGE_INPUTS = {
    "missing": (None, "cannot read"),
    "not JSON": (b"sweep: seed 3\n", "not JSON"),
    "an empty object": (b"{}", "not a sweep report: no 'seed', 'cases'"),
    "a list": (b"[1, 2]", "expected a report (a JSON object), got list"),
    "truncated": (json.dumps(REPORT.to_dict()).encode()[:-9], "not JSON"),
    "empty": (b"", "holds no report"),
    "deep brackets": (b"[" * 100_000, "not JSON"),
    "not utf-8": (b"\xff\xfe{}", "not JSON"),
    "a bad count": (
        json.dumps(REPORT.to_dict() | {"counts": {"a:b": {"ok": "1"}}}).encode(),
        "bad 'counts'",
    ),
    "a bad line": (
        (json.dumps(REPORT.to_dict()) + "\n" + json.dumps({"seed": 1}) + "\n").encode(),
        "line 2: not a sweep report",
    ),
}


@pytest.mark.parametrize("what", sorted(MERGE_INPUTS))
def test_a_file_merge_cannot_read_is_one_line_and_status_2(tmp_path, capsys, what) -> None:
    content, message = MERGE_INPUTS[what]
    path = tmp_path / "part.json"
    if content is not None:
        path.write_bytes(content)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(REPORT.to_dict()))
    with pytest.raises(SystemExit) as exit:
        sweep.main(["--merge", str(good), str(path)])
    assert exit.value.code == 2
    line = _one_error_line(capsys)
    assert str(path) in line and message in line


def test_merge_reads_json_lines(tmp_path, capsys) -> None:
    path = tmp_path / "parts.jsonl"
    path.write_text("\n".join(json.dumps(REPORT.to_dict()) for _ in range(2)) + "\n")
    assert sweep.main(["--merge", str(path)]) == 0
    assert "sweep seed=1: 2 cases" in capsys.readouterr().out


def test_merge_reads_crashed_counts_and_reports_without_them(tmp_path, capsys) -> None:
    crashed = sweep.Report(
        seed=1, cases=1, counts={"a:b": {"ok": 0, "refused": 0, "wrong": 0, "crashed": 1}}
    )
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    new.write_text(json.dumps(crashed.to_dict()))
    old.write_text(json.dumps(REPORT.to_dict()))  # a row without "crashed"
    assert sweep.main(["--merge", str(new), str(old), "--json", str(tmp_path / "m.json")]) == 1
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["counts"]["a:b"] == {"ok": 1, "refused": 0, "wrong": 0, "crashed": 1}
    capsys.readouterr()


def test_merge_refuses_a_row_with_an_unknown_count(tmp_path, capsys) -> None:
    part = REPORT.to_dict() | {"counts": {"a:b": {"ok": 1, "refused": 0, "wrong": 0, "x": 1}}}
    path = tmp_path / "part.json"
    path.write_text(json.dumps(part))
    with pytest.raises(SystemExit) as exit:
        sweep.main(["--merge", str(path)])
    assert exit.value.code == 2
    assert "bad 'counts'" in _one_error_line(capsys)


def test_a_bad_setting_is_a_usage_error_not_a_wrong_answer(env, capsys) -> None:
    env.set(ATTN_DISPATCH_BACKEND="nope")
    with pytest.raises(SystemExit) as exit:
        sweep.main(["--cases", "1", "--device", "cpu", "--longest", "8", "--quiet"])
    assert exit.value.code == 2
    assert "ATTN_DISPATCH_BACKEND" in _one_error_line(capsys)


def test_one_case_replays_by_its_index_on_the_named_implementations(toys, capsys) -> None:
    args = ["--seed", "4", "--device", "cpu", "--longest", "16", "--quiet"]
    assert sweep.main([*args, "--case", "3", "--implementations", "exact:oracle"]) == 0
    out = capsys.readouterr().out
    assert "1 cases on cpu" in out and "exact:oracle" in out and "toy:" not in out
    replayed = sweep.draw_cases(4, 4, longest=16)[3]
    assert replayed.describe() == sweep.draw_cases(40, 4, longest=16)[3].describe()


def test_an_implementation_not_installed_is_a_usage_error(toys, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        sweep.main(["--device", "cpu", "--case", "0", "--implementations", "nope:nothing"])
    assert exit_.value.code == 2 and "not installed: nope:nothing" in capsys.readouterr().err


def _collected(env: dict, marks: list[str] | None = None) -> list[str]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *(marks or ["-m", "slow"]),
            "tests/sweep/test_random_sweep_gpu.py",
        ],
        env={**os.environ, "ATTN_DISPATCH_SWEEP_SEED": "7", **env},
        capture_output=True,
        text=True,
        check=False,
    )
    return [line for line in result.stdout.splitlines() if "[" in line] or [result.stdout[-800:]]


def test_the_gpu_sweep_runs_one_shard_of_its_cases() -> None:
    ids = _collected({"ATTN_DISPATCH_SWEEP_SHARD": "1/3"})
    indices = [int(line.rsplit("[", 1)[1].rstrip("]")) for line in ids]
    assert len(indices) == 900 and all(i % 3 == 1 for i in indices), ids[:3]


def test_a_bad_sweep_shard_names_its_variable() -> None:
    ids = _collected({"ATTN_DISPATCH_SWEEP_SHARD": "3/3"})
    assert "ATTN_DISPATCH_SWEEP_SHARD" in ids[0]


def test_the_reported_shapes_run_in_the_first_shard_only() -> None:
    default = ["-m", "not slow"]
    first = _collected({"ATTN_DISPATCH_SWEEP_SHARD": "0/2"}, default)
    second = _collected({"ATTN_DISPATCH_SWEEP_SHARD": "1/2"}, default)

    def reported(lines: list[str]) -> list[str]:  # an empty parameter set collects as NOTSET
        return [line for line in lines if "reported_shape" in line and "NOTSET" not in line]

    assert len(reported(first)) == 11, first[:3]
    assert reported(second) == [], second[:3]


def test_the_gpu_sweep_collects_its_largest_compile_groups_first() -> None:
    """xdist hands the groups to workers in collection order: a large group collected last would
    run alone at the end of the run."""
    ids = _collected({}, ["-m", "not slow"])
    indices = [int(line.rsplit("[", 1)[1].rstrip("]")) for line in ids if "random_case" in line]
    drawn = sweep.draw_cases(3000, 7)
    groups = [drawn[i].compile_group for i in indices]
    sizes = Counter(groups)
    assert sorted(indices) == list(range(300)), ids[:3]
    assert [sizes[g] for g in groups] == sorted((sizes[g] for g in groups), reverse=True)
    assert len([g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]) == len(sizes)


def test_the_distribution_draws_gradients_laid_out_unlike_the_output() -> None:
    """grad_out in a layout of its own in some cases (never the case's, never beside a strided
    case), from a stream of its own."""
    cases = [d.case for seed in range(4) for d in sweep.draw_cases(200, seed)]
    apart = [c for c in cases if c.grad_layout is not None]
    # drawn beside every layout but the strided one
    share = sweep.GRAD_LAYOUT * (1 - sweep.STRIDED_LAYOUT)
    assert abs(len(apart) / len(cases) - share) < 0.04
    assert all(c.grad_layout != c.layout and c.layout != "strided" for c in apart)
    assert {c.grad_layout for c in apart} == set(sweep.GRAD_LAYOUTS)
