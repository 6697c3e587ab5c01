"""torch_sdpa's own-autograd-node path on the CPU: its gate and the signatures it covers (its
numerics on the GPU are in test_sdpa_own_node_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from attn_dispatch_torch_sdpa import _common, cudnn, flash
from attn_dispatch_torch_sdpa.cudnn import Cudnn
from attn_dispatch_torch_sdpa.efficient import Efficient
from attn_dispatch_torch_sdpa.flash import Flash
from packaging.version import Version

from attn_dispatch import backend as adb

LAYOUTS = ("bshd", "bhsd")


def _inputs(sq=128, sk=None, **flags) -> adb.ForwardInputs:
    sk = sq if sk is None else sk
    q = torch.empty(1, sq, 8, 64, dtype=torch.bfloat16, device="meta")
    k, v = (torch.empty(1, sk, 2, 64, dtype=torch.bfloat16, device="meta") for _ in range(2))
    return adb.make_inputs(q, k, v, **flags)


@pytest.fixture
def torch_release(monkeypatch):
    """Sets the torch release and build the gate reads (default: the proven one, CUDA)."""
    monkeypatch.delenv(_common.OWN_NODE_VARIABLE, raising=False)

    def set_release(version: str, hip: str | None = None) -> None:
        monkeypatch.setattr(_common, "torch_version", lambda: Version(version))
        monkeypatch.setattr(torch.version, "hip", hip)

    major, minor = _common.OWN_NODE_TORCH[0]
    set_release(f"{major}.{minor}.0")
    return set_release


def _offered() -> bool:
    offers = [
        callable(impl.autograd_forward(_inputs(causal=True), lay))
        for impl in (Flash(), Cudnn())
        for lay in LAYOUTS
    ]
    on = offers[0]
    assert offers == [on] * 4 and Flash().fast_paths()[0].on == Cudnn().fast_paths()[0].on == on
    return on


def test_the_own_node_is_on_with_a_proven_torch_on_nvidia(torch_release):
    assert _offered()
    assert "proven on" in Flash().fast_paths()[0].reason


def test_the_own_node_is_off_with_another_torch_or_on_rocm(torch_release):
    torch_release("2.13.0")
    assert not _offered()
    assert "proven on torch 2.11 only" in Flash().fast_paths()[0].reason
    torch_release("2.11.0", hip="7.0")
    assert not _offered()


def test_the_variable_turns_it_on_or_off_anywhere(torch_release, monkeypatch):
    monkeypatch.setenv(_common.OWN_NODE_VARIABLE, "0")
    assert not _offered()
    torch_release("2.13.0")
    monkeypatch.setenv(_common.OWN_NODE_VARIABLE, "1")
    assert _offered()
    monkeypatch.setenv(_common.OWN_NODE_VARIABLE, "maybe")
    with pytest.raises(ValueError, match=_common.OWN_NODE_VARIABLE):
        _offered()


@pytest.mark.parametrize(
    "flags",
    [
        {"causal": True, "causal_align": "bottom_right", "sk": 64},
        {"causal": True, "window": (16, 0)},
        {"sk": 0},
    ],
    ids=["rows-without-keys", "window", "no-keys"],
)
def test_flash_keeps_the_library_node_where_its_forward_cleans_rows_up(flags, torch_release):
    sk = flags.pop("sk", None)
    for layout in LAYOUTS:
        assert Flash().autograd_forward(_inputs(sk=sk, **flags), layout) is None


def test_efficient_offers_no_own_node(torch_release, monkeypatch):
    monkeypatch.setenv(_common.OWN_NODE_VARIABLE, "1")
    assert Efficient().autograd_forward(_inputs(causal=True), "bshd") is None


def test_cudnn_keeps_the_library_node_where_q_does_not_decide_the_output_s_layout(
    torch_release,
):
    # the library's backward hands cuDNN O in strides that q's decide; PyTorch allocates O
    # like q only for packed q with Dv = D, so elsewhere the two nodes' O would differ
    wide = torch.empty(1, 128, 8, 128, dtype=torch.bfloat16, device="meta")
    k, v = (torch.empty(1, 128, 2, 64, dtype=torch.bfloat16, device="meta") for _ in range(2))
    sliced = adb.make_inputs(wide[..., :64], k, v, causal=True)
    q = torch.empty(1, 128, 8, 64, dtype=torch.bfloat16, device="meta")
    narrow_v = torch.empty(1, 128, 2, 32, dtype=torch.bfloat16, device="meta")
    other_dv = adb.make_inputs(q, k, narrow_v, causal=True)
    for inp in (sliced, other_dv):
        for layout in LAYOUTS:
            assert Cudnn().autograd_forward(inp, layout) is None


class _Recording(torch.autograd.Function):
    """Stands in for the op's node: records the strides of the gradient it is handed."""

    strides: list[tuple[int, ...]] = []

    @staticmethod
    def forward(ctx, q):
        return q.clone()

    @staticmethod
    def backward(ctx, grad):
        _Recording.strides.append(grad.stride())
        return grad


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cudnn_node_function_calls_the_op_as_its_forward_does_and_lays_do_out_like_o(
    layout, torch_release, recorded_ops
):
    def results(args):
        batch, heads, seqlen, _ = args[0].shape
        return _Recording.apply(args[0]), torch.zeros(batch, heads, seqlen, 1)

    ops = recorded_ops(cudnn, results)
    dims = {"bshd": ((1, 16, 8, 64), (1, 16, 2, 64)), "bhsd": ((1, 8, 16, 64), (1, 2, 16, 64))}
    q = torch.randn(dims[layout][0]).requires_grad_()
    k, v = (torch.randn(dims[layout][1]).requires_grad_() for _ in range(2))
    rows = (q, k, v) if layout == "bshd" else (t.transpose(1, 2) for t in (q, k, v))
    inp = adb.make_inputs(*rows, causal=True, scale=0.3)
    with torch.no_grad():
        Cudnn().forward(inp)
    out = Cudnn().autograd_forward(inp, layout)(q, k, v)
    (name, forward_args, forward_kwargs), (node_name, node_args, node_kwargs) = ops.calls
    assert node_name == name == "_scaled_dot_product_cudnn_attention"
    assert node_kwargs == forward_kwargs == {"scale": 0.3}
    assert node_args[3:] == forward_args[3:] == (None, True, 0.0, True, False)
    for got, want in zip(node_args[:3], forward_args[:3]):
        assert (got.shape, got.stride()) == (want.shape, want.stride())
    assert out.shape == q.shape
    op_q = node_args[0]  # [B, H, S, D], as the op takes q and allocates O
    wanted = cudnn.strides_like(op_q.shape, op_q)
    _Recording.strides.clear()
    for grad in (
        torch.randn(out.shape),
        torch.randn(out.shape).transpose(1, 2).contiguous().transpose(1, 2),
        torch.ones(()).expand(out.shape),
    ):
        out = Cudnn().autograd_forward(inp, layout)(q, k, v)
        out.backward(grad)
        assert torch.equal(q.grad, grad) and q.grad.shape == q.shape
        q.grad = None
    assert _Recording.strides == [wanted] * 3


def test_the_gradient_hook_keeps_the_memory_where_only_size_1_dims_differ():
    grad = torch.randn(1, 4, 6, 8)
    strides = (999, 48, 8, 1)
    (moved,) = cudnn._gradient_in(strides, (grad,))
    assert moved.stride() == strides and moved.data_ptr() == grad.data_ptr()
    assert torch.equal(moved, grad)
    assert cudnn._gradient_in(grad.stride(), (grad,)) is None
    assert cudnn._gradient_in(strides, (None,)) is None


@pytest.mark.parametrize("causal", [True, False])
def test_flash_node_function_calls_the_op_as_its_forward_does(causal, torch_release, recorded_ops):
    ops = recorded_ops(flash)
    inp = _inputs(causal=causal, scale=0.3)
    flash._forward_op(inp)
    given = (inp.q, inp.k, inp.v)
    out = Flash().autograd_forward(inp, "bshd")(*given)
    (name, forward_args, forward_kwargs), (node_name, node_args, node_kwargs) = ops.calls
    assert node_name == name == "_flash_attention_forward"
    assert node_kwargs == forward_kwargs
    assert len(node_args) == len(forward_args)
    for got, want in zip(node_args, forward_args):
        if isinstance(want, torch.Tensor):
            assert (got.shape, got.stride()) == (want.shape, want.stride())
        else:
            assert got == want
    assert out.shape == given[0].shape


@pytest.mark.parametrize("causal", [True, False])
def test_flash_node_function_on_heads_first_tensors_is_sdpa_s_flash_op(
    causal, torch_release, recorded_ops
):
    ops = recorded_ops(flash)
    inp = _inputs(causal=causal, scale=0.3)
    given = tuple(t.transpose(1, 2) for t in (inp.q, inp.k, inp.v))
    out = Flash().autograd_forward(inp, "bhsd")(*given)
    ((name, args, kwargs),) = ops.calls
    assert name == "_scaled_dot_product_flash_attention"
    assert all(got is want for got, want in zip(args[:3], given))  # no views of the caller's
    assert args[3:] == (0.0, causal, False) and kwargs == {"scale": 0.3}
    assert out.shape == given[0].shape
