"""Is PyTorch's own node of the cuDNN sdpa op right when called as sdpa calls it?"""

import torch
import torch.nn.functional as F

op = torch.ops.aten._scaled_dot_product_cudnn_attention.default
print(op._schema)
dev = "cuda"


def rel(a, b):
    return ((a.float() - b).norm() / b.norm()).item()


def leaves(shape_q, shape_kv, memory):
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    for s in (shape_q, shape_kv, shape_kv):
        B, H, S, D = s
        if memory == "bhsd":
            t = torch.randn(B, H, S, D, generator=g, device=dev, dtype=torch.bfloat16)
            out.append(t.requires_grad_())
        else:  # [B, S, H, D] memory seen as [B, H, S, D]
            t = torch.randn(B, S, H, D, generator=g, device=dev, dtype=torch.bfloat16)
            out.append(t.requires_grad_())
    return out


for memory in ("bhsd", "bshd"):
    for B, H, Hk, S, D in ((1, 32, 8, 128, 128), (2, 6, 2, 77, 64), (1, 8, 8, 256, 128)):
        for causal in (True, False):
            for gradmem in ("contig", "transposed"):
                ls = leaves((B, H, S, D), (B, Hk, S, D), memory)
                views = ls if memory == "bhsd" else [t.transpose(1, 2) for t in ls]
                if gradmem == "contig":
                    grad = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16)
                else:
                    grad = torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
                res = {}
                for name in ("math", "sdpa", "op"):
                    for t in ls:
                        t.grad = None
                    if name == "math":
                        f = [v.detach().float().requires_grad_() for v in views]
                        o = F.scaled_dot_product_attention(*f, is_causal=causal, enable_gqa=True)
                        o.backward(grad.float())
                        res[name] = [o.detach()] + [x.grad for x in f]
                        continue
                    if name == "sdpa":
                        o = F.scaled_dot_product_attention(
                            *views, is_causal=causal, enable_gqa=True
                        )
                    else:
                        try:
                            o = op(*views, None, True, 0.0, causal, False, scale=D**-0.5)[0]
                        except Exception as e:
                            print("op error", memory, (B, H, Hk, S, D), str(e)[:150])
                            break
                    node = type(o.grad_fn).__name__
                    o.backward(grad)
                    gs = [t.grad if memory == "bhsd" else t.grad.transpose(1, 2) for t in ls]
                    res[name] = [o.detach()] + gs
                    res[name + "_node"] = node
                if "op" not in res:
                    continue
                errs = {
                    n: [round(rel(a, b), 4) for a, b in zip(res[n], res["math"])]
                    for n in ("sdpa", "op")
                }
                print(
                    memory,
                    (B, H, Hk, S, D),
                    "causal" if causal else "full",
                    gradmem,
                    res["sdpa_node"],
                    errs["sdpa"],
                    res["op_node"],
                    errs["op"],
                )
