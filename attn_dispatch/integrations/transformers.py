"""Hugging Face transformers (5.x) attention through ``attn_dispatch.attention``.

``register()`` adds an attention implementation and its mask function to transformers, after
which ``from_pretrained(..., attn_implementation="attn_dispatch")`` or
``model.set_attn_implementation("attn_dispatch")`` routes every attention layer of a decoder
model (Llama, Qwen2, Mistral, Gemma 2/3 and the like) through the dispatcher.

How transformers' inputs are mapped:

* q/k/v arrive BHSD (``[B, H, S, D]``); they are read as BSHD views (``transpose(1, 2)``, no
  copy) after their head counts are checked against the model config, so a tensor in the other
  layout is refused rather than read with heads and positions swapped.
* Queries are always the last ``Sq`` positions of the keys (a KV cache holds the rest), so
  causal masking is bottom-right aligned.
* The mask function returns ``None`` (no padding) or the 2-D key-padding mask itself. The
  attention function turns that mask, or ``position_ids`` that restart (packed documents), into
  varlen metadata once per forward: every layer receives the same tensor object, and the
  metadata is cached for that forward only (one host sync per forward and mask type, none per
  layer); see ``_MASKS`` for why a version counter is not trusted to tell when data changed.
* ``scaling``, ``sliding_window`` (as ``window=(W - 1, 0)``), ``softcap`` and ``s_aux`` (the
  per-head attention sinks of GPT-OSS, as ``sinks``: differentiable) are passed through.
* What cannot be computed exactly raises ``ValueError`` naming it: attention dropout, 4-D
  masks, custom mask patterns (chunked attention, image-token blocks, or/and mask functions),
  bidirectional sliding windows, and a sliding window over padding inside a row wherever
  transformers (counting positions) and the varlen form (counting real tokens) differ.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from .._autograd import attention
from .._varlen import Varlen, varlen_from_key_mask, varlen_from_mask, varlen_from_position_ids

try:
    from transformers import AttentionInterface, AttentionMaskInterface
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "attn_dispatch.integrations.transformers needs transformers: in a clone of "
        'attn_dispatch, pip install -e ".[transformers]"'
    ) from exc

__all__ = ["attention_forward", "mask_function", "register"]

#: Names transformers gives a meaning of its own (flash-only code paths, hub kernels, built-ins).
_BUILTIN_NAMES = ("eager", "sdpa", "flex_attention")

#: Parts of transformers' mask patterns this adapter reproduces exactly: causal (bottom-right),
#: bidirectional, the sliding-window overlay (the ``sliding_window`` argument of the attention
#: call carries the width) and packed documents (recomputed from ``position_ids``).
_EXACT_PATTERNS = {
    "causal_mask_function",
    "bidirectional_mask_function",
    "sliding_window_overlay",
    "packed_sequence_mask_function",
}

#: Wrappers that feed a pattern each token's position inside its packed document instead of its
#: index in the row (transformers >= 5.23 wraps the causal and sliding patterns of packed rows).
#: Within a document positions step by one, exactly as indices do, so a pattern that depends only
#: on the difference of the two (causal, sliding window, bidirectional) is unchanged by it: the
#: wrapped pattern is what is checked.
_POSITION_REMAPS = {"remap_positions_for_packed_sequence"}

#: Patterns known to need masking that causal + window cannot express.
_REFUSED_PATTERNS = {
    "chunked_overlay": "chunked attention (attention_chunk_size)",
    "blockwise_overlay": "block-wise masks (bidirectional image-token blocks)",
    "sliding_window_bidirectional_overlay": "bidirectional sliding-window attention",
    "padding_mask_function": "a padding mask folded into the mask function",
}

#: Attention-call keywords that change the result and are not supported, by what they are.
_REFUSED_KWARGS = {
    "sinks": "attention sinks passed as 'sinks' (transformers passes them as 's_aux')",
    "head_mask": "head masks",
}

# Varlen metadata is built (one host sync) by the first layer of a forward and reused by the
# others, which receive the same mask / position_ids object. A reused value must never describe
# data other than what it was built from, and a version counter cannot tell: inference tensors
# have none, and writes through ``.data``, a numpy view (``torch.from_numpy``) or DLPack leave it
# unchanged. Hence:
# * masks: cached only on the private copy ``mask_function`` makes for each forward, which no
#   caller holds; a mask that reaches ``attention_forward`` any other way is read at every call.
# * position_ids (the caller's tensor): cached for one forward only. A forward starts with the
#   mask function (transformers calls it before the first layer), which ends every entry; a layer
#   that asks again (the next forward, or a recomputation) starts a new entry too.
_MASKS: WeakIdKeyDictionary = WeakIdKeyDictionary()  # mask -> {key: value}
_POSITIONS: WeakIdKeyDictionary = WeakIdKeyDictionary()  # position_ids -> _Entry
_forwards = [0]  # forwards begun (mask function calls); entries of an earlier one are stale

#: Key marking a mask whose keys are all real: it only trims a static cache's buffer.
_TRIM_ONLY = "trim-only"


@dataclass
class _Entry:
    """Metadata built from ``position_ids`` in forward ``forward``, and the layers that used it."""

    forward: int
    version: int | None
    key: object
    value: object
    users: weakref.WeakSet = field(default_factory=weakref.WeakSet)


def register(name: str = "attn_dispatch") -> str:
    """Register the attention function and its mask function under ``name``; returns ``name``.

    Call before ``from_pretrained(..., attn_implementation=name)`` or
    ``model.set_attn_implementation(name)``. Both registrations are needed: without the mask
    function transformers would hand every layer ``attention_mask=None`` and padding would be
    lost. Names transformers interprets itself (built-ins, anything containing ``flash``, hub
    kernels ``org/repo``, ``paged|...``) are refused.
    """
    if not isinstance(name, str):
        raise TypeError(f"argument 'name': expected a str, got {type(name).__name__}")
    if (
        not name
        or name in _BUILTIN_NAMES
        or "flash" in name.lower()
        or "/" in name
        or name.startswith("paged|")
    ):
        raise ValueError(
            f"argument 'name': {name!r} is empty or has a meaning of its own in transformers "
            "(a built-in, a name containing 'flash', a hub kernel 'org/repo' or 'paged|...'); "
            "choose another, e.g. 'attn_dispatch'"
        )
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask_function)
    return name


# ----------------------------------------------------------------------------------------------
# Mask function: run by transformers once per forward and mask type, its result handed unchanged
# to every layer of that type.


def _pattern_parts(fn: Callable) -> Iterator[str]:
    """Qualified names of the building blocks of a transformers mask function (and/or nested)."""
    qualname = getattr(fn, "__qualname__", type(fn).__name__)
    if qualname.split(".<locals>")[0] in _POSITION_REMAPS:
        wrapped = [c.cell_contents for c in fn.__closure__ or () if callable(c.cell_contents)]
        if len(wrapped) != 1:  # not the wrapper we know: judged as a pattern of its own
            yield qualname
            return
        yield from _pattern_parts(wrapped[0])
        return
    if qualname.startswith(("and_masks.", "or_masks.")):
        yield qualname.split(".")[0]
        for cell in fn.__closure__ or ():
            parts = cell.cell_contents
            for part in parts if isinstance(parts, tuple) else (parts,):
                if callable(part):
                    yield from _pattern_parts(part)
        return
    yield qualname


@torch.compiler.assume_constant_result
def _refused_part(pattern: Callable) -> str:
    """What in ``pattern`` cannot be computed exactly, or ``""``.

    A constant for the compiler: it only inspects Python function objects, which the compiler
    cannot trace, and its answer does not change while a graph is in use.
    """
    for part in _pattern_parts(pattern):
        base = part.split(".<locals>")[0]
        if base not in _EXACT_PATTERNS and base != "and_masks":
            return _REFUSED_PATTERNS.get(base, f"the mask pattern {part!r}")
    return ""


def _check_pattern(pattern: Callable | None, use_vmap: bool) -> None:
    if use_vmap:
        raise ValueError(
            "attn_dispatch cannot compute custom mask functions (or_mask_function / "
            "and_mask_function, e.g. Gemma 3 image tokens or bidirectional overlays); use "
            "attn_implementation='sdpa' or 'eager' for this model"
        )
    what = "" if pattern is None else _refused_part(pattern)
    if what:
        raise ValueError(f"attn_dispatch cannot compute {what}; use attn_implementation='sdpa'")


def _is_compiling() -> bool:
    return torch.compiler.is_compiling()


def mask_function(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | Tensor = 0,
    kv_offset: int = 0,
    mask_function: Callable | None = None,
    attention_mask: Tensor | None = None,
    use_vmap: bool = False,
    device: torch.device | None = None,
    **kwargs: Any,
) -> Tensor | None:
    """The mask for ``attention_forward``: ``None`` or a 2-D bool key mask ``[B, L]``.

    ``L <= kv_length``: a static cache hands every layer its whole buffer, with empty slots at
    the end, and only the first ``L`` keys are real. A mask whose keys are all real is ``None``
    (or marked as trim-only when ``L < kv_length``), so unpadded batches stay dense. The result
    is a plain tensor, right-sliced, because ``generate`` may feed it back in.
    """
    _check_pattern(mask_function, use_vmap)
    _begin_forward()
    if attention_mask is None:
        end = q_offset + q_length  # the keys after this position are unwritten cache slots
        if isinstance(end, Tensor):
            if _is_compiling():
                raise ValueError(
                    "attn_dispatch needs an attention_mask with a static cache under "
                    "torch.compile (the number of filled cache slots is otherwise unknown)"
                )
            end = int(end)
        if end >= kv_offset + kv_length:
            return None
        mask = torch.ones(batch_size, end - kv_offset, dtype=torch.bool, device=device)
        _own(mask, trim_only=True)
        return mask
    if attention_mask.dim() != 2:
        raise ValueError(
            f"argument 'attention_mask': expected a 2-D key-padding mask, got shape "
            f"{tuple(attention_mask.shape)}"
        )
    # a copy of our own: the caller may refill its tensor, a copy nobody else holds stays as read
    mask = attention_mask[:, -kv_length:].to(torch.bool, copy=True)
    trim_only = False
    if not _is_compiling() and bool(mask.all()):
        if mask.shape[1] == kv_length:
            return None
        trim_only = True
    _own(mask, trim_only=trim_only)
    return mask


# ----------------------------------------------------------------------------------------------
# Attention function: called by every attention layer.


def _version(t: Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference tensors keep no version counter
        return None


def _begin_forward() -> None:
    """A forward starts: no position_ids metadata of an earlier one is reused."""
    if not _is_compiling():
        _forwards[0] += 1


def _own(mask: Tensor, trim_only: bool) -> None:
    """Record ``mask`` as made by the mask function, so its metadata may be cached."""
    if not _is_compiling():
        _MASKS[mask] = {_TRIM_ONLY: True} if trim_only else {}


def _is_trim_only(mask: Tensor) -> bool:
    return not _is_compiling() and _MASKS.get(mask, {}).get(_TRIM_ONLY, False)


def _mask_cached(mask: Tensor, key: object, build: Callable[[], Any]) -> Any:
    """``build()``, once per mask the mask function made (and ``key``); every call otherwise.

    Under ``torch.compile`` the weak dictionary cannot be traced, so the metadata is rebuilt.
    """
    store = None if _is_compiling() else _MASKS.get(mask)
    if store is None:
        return build()
    if key not in store:
        store[key] = build()
    return store[key]


def _positions_cached(
    position_ids: Tensor, module: torch.nn.Module, key: object, build: Callable[[], Any]
) -> Any:
    """``build()``, reused by the other layers of the forward that built it."""
    if _is_compiling():
        return build()
    entry = _POSITIONS.get(position_ids)
    if (
        entry is not None
        and entry.forward == _forwards[0]
        and entry.version == _version(position_ids)
        and entry.key == key
        and module not in entry.users
    ):
        entry.users.add(module)
        return entry.value
    entry = _Entry(_forwards[0], _version(position_ids), key, build())
    entry.users.add(module)
    _POSITIONS[position_ids] = entry
    return entry.value


def _expected_heads(module: torch.nn.Module) -> tuple[int | None, int | None, int | None]:
    config = getattr(module, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return heads, kv_heads, getattr(module, "head_dim", None)


def _bshd(name: str, t: Tensor, heads: int | None, head_dim: int | None) -> Tensor:
    """A BSHD view of transformers' BHSD ``t``, after checking that it is BHSD."""
    if not isinstance(t, Tensor) or t.dim() != 4:
        shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"argument '{name}': expected a 4-D BHSD tensor, got {shape}")
    if (heads is not None and t.shape[1] != heads) or (
        name == "query" and head_dim is not None and t.shape[3] != head_dim
    ):
        raise ValueError(
            f"argument '{name}': expected BHSD [batch, heads={heads}, seq, head_dim] as "
            f"transformers passes it, got shape {tuple(t.shape)} (a BSHD tensor?)"
        )
    return t.transpose(1, 2)


def _window(sliding_window: int | None, causal: bool, longest_k: int) -> dict:
    """transformers' sliding window as ``attention``'s ``window``.

    transformers lets query i see key j iff ``j > i - W`` (and ``j <= i`` when causal): W keys
    counting the query's own, i.e. ``window=(W - 1, 0)``. A window at least as long as every key
    sequence masks nothing and is left out, so kernels without window support stay eligible.
    """
    if sliding_window is None:
        return {}
    if not causal:
        raise ValueError(
            "attn_dispatch does not compute bidirectional sliding-window attention "
            f"(sliding_window={sliding_window} with is_causal=False)"
        )
    if longest_k <= sliding_window:
        return {}
    return {"window": (sliding_window - 1, 0)}


def _check_sliding_window(sliding_window: object) -> int | None:
    """``None`` or an int >= 1 (never a bool, a float or a str, which ``int()`` would accept)."""
    if sliding_window is None:
        return None
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, numbers.Integral):
        raise TypeError(
            f"argument 'sliding_window': expected an int >= 1 or None, got "
            f"{type(sliding_window).__name__}"
        )
    if sliding_window < 1:
        raise ValueError(f"argument 'sliding_window': expected an int >= 1, got {sliding_window}")
    return int(sliding_window)


def _check_is_causal(is_causal: object, module: torch.nn.Module) -> bool:
    """The caller's ``is_causal`` (a bool, or None for the module's own flag, read as
    transformers' attention functions read it)."""
    if is_causal is None:
        return bool(getattr(module, "is_causal", True))
    if not isinstance(is_causal, bool):
        raise TypeError(f"argument 'is_causal': expected a bool, got {type(is_causal).__name__}")
    return is_causal


def _refuse(dropout: float, attention_mask: Tensor | None, kwargs: dict) -> None:
    if dropout:
        raise ValueError(
            f"attn_dispatch does not compute attention dropout (dropout={dropout}); set the "
            "config's attention_dropout to 0.0"
        )
    for key, what in _REFUSED_KWARGS.items():
        if kwargs.get(key) is not None:
            raise ValueError(f"attn_dispatch does not compute {what} (argument {key!r})")
    if attention_mask is not None and (
        not isinstance(attention_mask, Tensor) or attention_mask.dim() != 2
    ):
        shape = (
            tuple(attention_mask.shape)
            if isinstance(attention_mask, Tensor)
            else type(attention_mask).__name__
        )
        raise ValueError(
            "attn_dispatch computes causal attention with key padding only; it cannot apply "
            f"an arbitrary 4-D attention mask (got {shape}); pass a 2-D attention_mask, or use "
            "attn_implementation='sdpa'"
        )


def _padded_metadata(mask: Tensor, seqlen_q: int, causal: bool) -> tuple[Varlen, Varlen]:
    """``(queries, keys)`` of a padding mask. Causal: the queries are the last ``seqlen_q``
    positions of the keys' rows (a KV cache holds the others). Bidirectional (an encoder, or
    cross-attention over an encoder's keys, whose queries are another sequence): the mask pads
    the keys only and every query is real, as eager attention computes every query row."""
    if causal:
        return _mask_cached(mask, seqlen_q, lambda: varlen_from_key_mask(mask, seqlen_q))

    def build() -> tuple[Varlen, Varlen]:
        return _all_real(mask.shape[0], seqlen_q, mask.device), varlen_from_mask(mask)

    return _mask_cached(mask, ("keys", seqlen_q), build)


def _all_real(batch: int, seqlen: int, device: torch.device) -> Varlen:
    """Varlen metadata of ``[batch, seqlen]`` rows without padding (no device read)."""
    cu = torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32, device=device)
    return Varlen(torch.arange(batch * seqlen, device=device), cu, seqlen, batch, seqlen)


def _packed_metadata(position_ids: Tensor, batch: int, module: torch.nn.Module) -> Varlen:
    def build() -> Varlen:
        return varlen_from_position_ids(position_ids.expand(batch, -1))

    return _positions_cached(position_ids, module, batch, build)


def _gapped_span(mask: Tensor) -> int:
    """The longest first-to-last real key span of a row with padding inside it; 0 if none."""
    if mask.numel() == 0:
        return 0
    length = mask.shape[1]
    idx = torch.arange(length, device=mask.device)
    first = torch.where(mask, idx, length).amin(1)
    last = torch.where(mask, idx, -1).amax(1)
    span = (last - first + 1).clamp(min=0)
    return int(torch.where(mask.sum(1) < span, span, 0).amax())


def _check_window_over_padding(mask: Tensor, sliding_window: int) -> None:
    """Refuse a window that padding inside a row would make inexact.

    transformers counts the window in positions, the varlen form in real tokens: the two agree
    where a row's real keys are contiguous (left or right padding), or where a row with holes
    spans no more than the window (the window then hides nothing in either).
    """
    span = _mask_cached(mask, "gapped_span", lambda: _gapped_span(mask))
    if span > sliding_window:
        raise ValueError(
            f"attn_dispatch cannot compute a sliding window (sliding_window={sliding_window}) "
            f"over an attention_mask with padding between real tokens (a row's real tokens span "
            f"{span} positions): transformers counts the window in positions, padding included, "
            "and the varlen form it would run in counts real tokens only; pad on the left or "
            "the right only, or use attn_implementation='sdpa'"
        )


def _varlen_attention(q: Tensor, k: Tensor, v: Tensor, vq: Varlen, vk: Varlen, opts: dict):
    return attention(
        vq.unpad(q),
        vk.unpad(k),
        vk.unpad(v),
        cu_seqlens_q=vq.cu_seqlens,
        cu_seqlens_k=vk.cu_seqlens,
        max_seqlen_q=vq.max_seqlen,
        max_seqlen_k=vk.max_seqlen,
        **opts,
    )


def attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    *,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    position_ids: Tensor | None = None,
    cu_seq_lens_q: Tensor | None = None,
    cu_seq_lens_k: Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    s_aux: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention interface: ``(out [B, Sq, H, Dv], None)`` from BHSD q/k/v.

    ``attention_mask`` is what :func:`mask_function` returned. Precedence, as in transformers'
    flash path: a padding mask, then ``cu_seq_lens_q/k`` (``DataCollatorWithFlattening``, batch
    of one), then ``position_ids`` that restart (packed documents), else dense. ``s_aux``: the
    layer's attention sinks (GPT-OSS), one logit per query head.
    """
    _refuse(dropout, attention_mask, kwargs)
    heads, kv_heads, head_dim = _expected_heads(module)
    q = _bshd("query", query, heads, head_dim)
    k = _bshd("key", key, kv_heads, None)
    v = _bshd("value", value, kv_heads, None)
    causal = _check_is_causal(is_causal, module)
    sliding_window = _check_sliding_window(sliding_window)
    # scaling and softcap go to attention as given: its checks refuse what is not a number
    opts: dict[str, Any] = {"causal": causal, "causal_align": "bottom_right", "scale": scaling}
    if softcap is not None:
        opts["softcap"] = softcap
    if s_aux is not None:
        # every path below passes opts to attention, which validates the sinks ([H] tensor)
        opts["sinks"] = s_aux
    batch, seqlen_q = q.shape[0], q.shape[1]

    if attention_mask is not None:
        length = attention_mask.shape[1]
        # causal: the queries are the last of the mask's positions; bidirectional: it masks keys
        least = seqlen_q if causal else 1
        if attention_mask.shape[0] != batch or not least <= length <= k.shape[1]:
            raise ValueError(
                f"argument 'attention_mask': expected [batch={batch}, L] with {least} <= L <= "
                f"{k.shape[1]} (queries, keys), got {tuple(attention_mask.shape)}"
            )
        k, v = k[:, :length], v[:, :length]  # a static cache's unwritten slots are dropped
        if not _is_trim_only(attention_mask):
            vq, vk = _padded_metadata(attention_mask, seqlen_q, causal)
            opts |= _window(sliding_window, causal, vk.max_seqlen)
            if sliding_window is not None:
                _check_window_over_padding(attention_mask, sliding_window)
            return vq.pad(_varlen_attention(q, k, v, vq, vk, opts)), None

    elif cu_seq_lens_q is not None or cu_seq_lens_k is not None:
        tensors, flags = _given_varlen(
            q, k, v, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k
        )
        opts |= _window(sliding_window, causal, flags["max_seqlen_k"])
        out = attention(*tensors, **flags, **opts)
        return out.view(batch, seqlen_q, *out.shape[1:]), None

    elif position_ids is not None and position_ids.dim() == 2 and 1 < seqlen_q == k.shape[1]:
        packed = _packed_metadata(position_ids, batch, module)
        if packed.num_sequences > batch:
            opts |= _window(sliding_window, causal, packed.max_seqlen)
            out = _varlen_attention(q, k, v, packed, packed, opts)
            return out.view(batch, seqlen_q, *out.shape[1:]), None

    opts |= _window(sliding_window, causal, k.shape[1])
    return attention(q, k, v, **opts), None


def _given_varlen(q, k, v, cu_q, cu_k, max_q, max_k) -> tuple[tuple, dict]:
    """THD views and varlen arguments from ``cu_seq_lens_*`` / ``max_length_*`` keywords."""
    if cu_q is None or cu_k is None or max_q is None or max_k is None:
        raise ValueError(
            "arguments 'cu_seq_lens_q', 'cu_seq_lens_k', 'max_length_q', 'max_length_k': "
            "expected all four together"
        )
    if q.shape[0] != 1:
        raise ValueError(
            f"arguments 'cu_seq_lens_q/k': expected a batch of one packed row, got batch "
            f"{q.shape[0]}"
        )
    flags = dict(
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=int(max_q), max_seqlen_k=int(max_k)
    )
    return (q[0], k[0], v[0]), flags
