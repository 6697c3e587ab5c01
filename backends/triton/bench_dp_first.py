"""dK/dV with dP's product before the exponentials (``DP_FIRST``) or after, per seed shape.

``DP_FIRST`` (a dK/dV config key; the tuning table sets it per shape class) only reorders
independent work in the unmasked blocks, so both orders must give bitwise equal gradients. This
script runs each order in its own process (``$ATTN_DISPATCH_TRITON_CACHE`` holds tuned entries
that copy the table's dK/dV configuration with ``DP_FIRST`` set to 0 or 1 for every D=128 class),
checks that the gradients match the reference backend (outputs poisoned first) and that the two
orders agree bitwise, then times the backward kernels (``triton.testing.do_bench`` median; two
rounds, the order of the variants reversed in the second).

    PYTHONUNBUFFERED=1 python backends/triton/bench_dp_first.py [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile

SHAPES = [  # (name, H, Hkv, S, causal): the seed shapes
    (f"{kind} {s // 1024}K" + (" causal" if causal else ""), h, hk, s, causal)
    for kind, h, hk in (("GQA 64/8", 64, 8), ("MHA 8", 8, 8)) for causal in (False, True)
    for s in (1024, 2048, 4096, 8192, 16384)
]
ORDERS = (0, 1)


def write_cache(directory: str, dp_first: int) -> None:
    """Tuned entries for this GPU's arch: the table's dK/dV config of every D=128 length bucket
    with ``DP_FIRST`` set."""
    import torch
    from attn_dispatch_triton import tuning

    arch = tuning.arch_of(torch.device("cuda"))
    entries = {}
    for causal in (False, True):
        for group in (1, 8):
            for seqlen_k in (1024, 2048, 1 << 30):
                keys = tuning.lookup_keys(128, causal, group, seqlen_k)
                dkdv = tuning.lookup(arch, 128, causal, group, seqlen_k)["dkdv"]
                entries[keys[-1]] = {"dkdv": {**dkdv, "DP_FIRST": dp_first}}
    with open(tuning.cache_path(arch), "w") as f:  # under $ATTN_DISPATCH_TRITON_CACHE
        json.dump(entries, f, indent=1)


def worker(mode: str, out_path: str) -> None:
    """One process, one order: ``check`` (errors against the reference, gradient digests) or
    ``time`` (µs per backward) at every seed shape, written as JSON to ``out_path``."""
    import torch
    import triton.testing
    from attn_dispatch_triton.backward import attention_backward

    import attn_dispatch as ad

    res = {}
    for name, h, hk, s, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(s + h + causal)
        q, k, v = (torch.randn(1, s, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                   for n in (h, hk, hk))
        out, lse = ad.forward(q, k, v, causal=causal, backend="triton:fused")
        do = torch.randn(out.shape, device="cuda", dtype=torch.bfloat16, generator=g)
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))

        def run(q=q, k=k, v=v, out=out, lse=lse, do=do, dq=dq, dk=dk, dv=dv, causal=causal):
            return attention_backward(q, k, v, out, lse, do, causal=causal, bottom_right=False,
                                      scale=128**-0.5, dq=dq, dk=dk, dv=dv)

        if mode == "check":
            got = run()
            ref = ad.backward(q, k, v, out, lse, do, causal=causal, backend="reference")
            errs = [((a.double() - r.double()).norm() / r.double().norm()).item()
                    for a, r in zip(got, ref)]
            digest = [hashlib.sha256(t.view(torch.int16).cpu().numpy().tobytes()).hexdigest()
                      for t in got]  # bitwise identity of the gradients across processes
            res[name] = {"errs": errs, "digest": digest}
        else:
            run()
            res[name] = triton.testing.do_bench(run, warmup=50,
                                                rep=500 if s >= 16384 else 200) * 1e3
    with open(out_path, "w") as f:
        json.dump(res, f)


def spawn(dp_first: int, mode: str, out_dir: str) -> tuple[subprocess.Popen, str]:
    """Start a worker with its own tuning cache (``DP_FIRST`` = ``dp_first``)."""
    cache = os.path.join(out_dir, f"cache-dp{dp_first}")
    os.makedirs(cache, exist_ok=True)
    env = {**os.environ, "ATTN_DISPATCH_TRITON_CACHE": cache}
    subprocess.run([sys.executable, __file__, "cache", str(dp_first), cache], env=env, check=True)
    path = os.path.join(out_dir, f"{mode}-dp{dp_first}.json")
    with open(path.replace(".json", ".log"), "w") as log:  # the child keeps its own handle
        proc = subprocess.Popen([sys.executable, __file__, "worker", mode, path], env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    return proc, path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="directory for the per-process results")
    out_dir = ap.parse_args().out or tempfile.mkdtemp(prefix="dp_first_")
    os.makedirs(out_dir, exist_ok=True)
    # checks in parallel (each process compiles its kernels), then the timings one at a time
    checks = {}
    running = {dp: spawn(dp, "check", out_dir) for dp in ORDERS}
    for dp, (proc, path) in running.items():
        if proc.wait() != 0:
            for other, _ in running.values():
                other.kill()
            sys.exit(f"check DP_FIRST={dp} failed: see {path.replace('.json', '.log')}")
        with open(path) as f:
            checks[dp] = json.load(f)
    times: dict[int, list[dict]] = {dp: [] for dp in ORDERS}
    for order in (ORDERS, ORDERS[::-1]):
        for dp in order:
            proc, path = spawn(dp, "time", out_dir)
            if proc.wait() != 0:
                sys.exit(f"timing DP_FIRST={dp} failed: see {path.replace('.json', '.log')}")
            with open(path) as f:
                times[dp].append(json.load(f))
    print(f"\n{'shape':<22}{'after µs':>14}{'first µs':>14}{'change':>9}  check")
    failed = False
    for name, *_ in SHAPES:
        after, first = ([r[name] for r in times[dp]] for dp in ORDERS)
        errs = [e for dp in ORDERS for e in checks[dp][name]["errs"]]
        err = max(errs, key=lambda e: math.inf if math.isnan(e) else e)  # NaN is the worst
        same = checks[0][name]["digest"] == checks[1][name]["digest"]
        ok = same and all(e < 1e-2 for e in errs)  # (False for NaN)
        failed |= not ok
        print(f"{name:<22}{'/'.join(f'{t:.0f}' for t in after):>14}"
              f"{'/'.join(f'{t:.0f}' for t in first):>14}{min(first) / min(after) - 1:>+9.1%}  "
              f"{'OK' if ok else 'FAIL'} (rel_l2 {err:.1e}, bitwise equal {same})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "cache":
        write_cache(sys.argv[3], int(sys.argv[2]))
    else:
        main()
