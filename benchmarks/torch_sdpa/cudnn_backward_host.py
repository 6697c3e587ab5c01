"""Host time of torch_sdpa:cudnn's backward around its op (the op stubbed: it needs a GPU).

CPU, one tree at a time: ``PYTHONPATH=<tree>/backends/torch_sdpa python
benchmarks/torch_sdpa/cudnn_backward_host.py NAME``
"""

import statistics
import sys
import time

import torch
from attn_dispatch_torch_sdpa import cudnn
from attn_dispatch_torch_sdpa.cudnn import Cudnn

from attn_dispatch import backend as adb

B, S, H, HK, D = 1, 128, 32, 8, 128
q = torch.randn(B, H, S, D, dtype=torch.bfloat16).transpose(
    1, 2
)  # [B, H, S, D] memory, as layout="bhsd"
k, v = (torch.randn(B, HK, S, D, dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
out = torch.randn(B, H, S, D, dtype=torch.bfloat16).transpose(1, 2)
grad = torch.randn(B, H, S, D, dtype=torch.bfloat16).transpose(1, 2)
lse = torch.zeros(B, H, S)
results = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
cudnn.aten = lambda spec: lambda *a, **kw: results
inp = adb.make_inputs(q, k, v, out, lse, grad, causal=True)
impl = Cudnn()
if hasattr(impl, "prepare"):
    inp.plan = impl.prepare(inp)
for _ in range(200):
    impl.backward(inp)
rounds = []
for _ in range(15):
    t = time.perf_counter()
    for _ in range(2000):
        impl.backward(inp)
    rounds.append((time.perf_counter() - t) / 2000 * 1e6)
print(sys.argv[1], f"{statistics.median(rounds):.2f} us")
