"""attn_dispatch inside Hugging Face transformers: tiny random models built from configs.

Every check compares against transformers' own ``eager``/``sdpa`` attention on the same weights,
or (packed documents) against each document run alone. GPT-OSS (attention sinks, alternating
sliding-window and full layers, a mixture of experts) is compared with ``eager`` only: it is the
one attention transformers gives it that computes sinks on the CPU.
"""

from __future__ import annotations

import copy
import inspect
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    Gemma2Config,
    Gemma2ForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import attn_dispatch as ad  # noqa: E402
from attn_dispatch.integrations import transformers as adt  # noqa: E402

NAME = adt.register()
VOCAB, S = 64, 12
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    head_dim=8,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def _gpt_oss_with_sinks(**sizes) -> GptOssForCausalLM:
    """A GPT-OSS of these sizes with 4 experts (run by transformers' eager experts, which take
    float64 on the CPU) and sinks drawn N(0, 1), so that they carry a real share of each row's
    mass (the model's own init is N(0, 0.02²))."""
    config = GptOssConfig(
        **sizes,
        num_local_experts=4,
        num_experts_per_tok=2,
        experts_implementation="eager",
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    model = GptOssForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
    return model


def gpt_oss() -> GptOssForCausalLM:
    """A tiny GPT-OSS: a sliding-window (5) layer then a full one, GQA 4/2."""
    return _gpt_oss_with_sinks(**COMMON, num_key_value_heads=2, sliding_window=5)


# window 5 < S so the band is exercised; Gemma 2: softcap and a scale that is not D^-1/2.
MODELS = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, num_key_value_heads=2)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**COMMON, num_key_value_heads=1)),
    "mistral": lambda: MistralForCausalLM(
        MistralConfig(**COMMON, num_key_value_heads=2, sliding_window=5)
    ),
    "gemma2": lambda: Gemma2ForCausalLM(
        Gemma2Config(
            **COMMON,
            num_key_value_heads=2,
            sliding_window=5,
            query_pre_attn_scalar=12,
            attn_logit_softcapping=2.0,
        )
    ),
    "gpt_oss": gpt_oss,
}
# Compared with eager in every dtype: transformers' sdpa has no attention sinks. GPT-OSS's eager
# takes its softmax in the inputs' dtype, so float64 is held to the float64 tolerance.
EAGER_ONLY = {"gpt_oss"}
TOL = {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=2e-4, atol=2e-5)}
# transformers' eager attention takes the softmax in float32 even for float64 inputs.
EAGER_F64_TOL = dict(rtol=1e-6, atol=1e-7)


def padded_dtype(name: str) -> torch.dtype:
    """float64, except for Gemma 2: its float64 ``eager`` reference turns a fully masked row into
    NaN (a float64 ``-inf`` mask meets a float32 softmax) and the NaN reaches real rows through
    zero attention weights; in float32 its mask is finite."""
    return torch.float32 if name == "gemma2" else torch.float64


def reference(name: str, dtype: torch.dtype) -> tuple[str, dict]:
    """The transformers implementation to compare with, and the tolerance that it allows.

    float64: ``sdpa`` (exact in float64), except for Gemma 2, whose soft-cap ``sdpa`` ignores,
    so its float64 reference is ``eager`` with the float32-softmax tolerance. float32: ``eager``.
    """
    if dtype == torch.float32 or name in EAGER_ONLY:
        return "eager", TOL[dtype]
    if name == "gemma2":
        return "eager", EAGER_F64_TOL
    return "sdpa", TOL[dtype]


def make_pair(name: str, dtype: torch.dtype, ref: str | None = None):
    """(reference model, attn_dispatch model) with identical random weights."""
    ref = ref or reference(name, dtype)[0]
    torch.manual_seed(0)
    theirs = MODELS[name]().to(dtype)
    ours = copy.deepcopy(theirs)
    theirs.set_attn_implementation(ref)
    ours.set_attn_implementation(NAME)
    return theirs, ours


def run(model, ids, mask=None, labels=None, **kw):
    model.zero_grad(set_to_none=True)
    out = model(ids, attention_mask=mask, labels=labels, use_cache=False, **kw)
    out.loss.backward()
    grads = {n.removeprefix("_orig_mod."): p.grad for n, p in model.named_parameters()}
    return out.logits.detach(), out.loss.detach(), grads


def assert_match(a, b, tol, where=None):
    la, lossa, ga = a
    lb, lossb, gb = b
    if where is not None:
        la, lb = la[where], lb[where]
    torch.testing.assert_close(lb, la, **tol)
    torch.testing.assert_close(lossb, lossa, **tol)
    assert ga.keys() == gb.keys()
    for name in ga:
        assert gb[name] is not None, name
        torch.testing.assert_close(gb[name], ga[name], **tol, msg=name)


def tokens(batch: int, seqlen: int = S) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, seqlen), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", list(MODELS))
def test_logits_loss_and_every_gradient_match(name, dtype):
    theirs, ours = make_pair(name, dtype)
    ids = tokens(2)
    tol = reference(name, dtype)[1]
    assert_match(run(theirs, ids, labels=ids), run(ours, ids, labels=ids), tol)


def padding(side: str) -> torch.Tensor:
    """Rows of 12, 7 and 1 real tokens, padded on ``side``."""
    mask = torch.zeros(3, S, dtype=torch.long)
    for row, n in enumerate((S, 7, 1)):
        if side == "left":
            mask[row, S - n :] = 1
        else:
            mask[row, :n] = 1
    return mask


def real_labels(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Labels predicted from real positions only: token t counts iff t and t - 1 are real.

    A padding position's output is unspecified (attn_dispatch gives 0, transformers whatever its
    mask makes of an empty row), so no label may be predicted from one.
    """
    prev = torch.nn.functional.pad(mask[:, :-1], (1, 0))
    return ids.masked_fill((mask * prev) == 0, -100)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", list(MODELS))
def test_padded_batch(name, side):
    dtype = padded_dtype(name)
    theirs, ours = make_pair(name, dtype)
    ids, mask = tokens(3), padding(side)
    labels = real_labels(ids, mask)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    real = mask.bool()
    a = run(theirs, ids, mask, labels, position_ids=pos)
    b = run(ours, ids, mask, labels, position_ids=pos)
    assert_match(a, b, reference(name, dtype)[1], where=real)
    assert torch.all(torch.isfinite(b[0]))


@pytest.mark.parametrize("name", list(MODELS))
def test_packed_documents(name):
    dtype = torch.float64
    theirs, ours = make_pair(name, dtype)
    lens = (7, 4, 1)
    ids = tokens(1)
    position_ids = torch.cat([torch.arange(n) for n in lens])[None]
    alone = torch.cat([theirs(d, use_cache=False).logits for d in ids.split(lens, dim=1)], 1)
    packed = ours(ids, position_ids=position_ids).logits  # with a cache too: still separate
    torch.testing.assert_close(packed, alone, **reference(name, dtype)[1])
    cu = torch.tensor([0, 7, 11, 12], dtype=torch.int32)
    given = ours(
        ids,
        position_ids=position_ids,
        cu_seq_lens_q=cu,
        cu_seq_lens_k=cu,
        max_length_q=7,
        max_length_k=7,
    ).logits
    torch.testing.assert_close(given, alone, **reference(name, dtype)[1])


@pytest.mark.parametrize("name", list(MODELS))
def test_left_padded_greedy_generate(name):
    theirs, ours = make_pair(name, padded_dtype(name))
    ids, mask = tokens(3), padding("left")
    args = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    expected = theirs.generate(ids, **args)
    assert torch.equal(ours.generate(ids, **args), expected)
    if name == "llama":
        assert torch.equal(ours.generate(ids, cache_implementation="static", **args), expected)
        assert torch.equal(ours.generate(ids, prefill_chunk_size=5, **args), expected)


def test_thirty_training_steps_follow_the_same_loss_curve():
    curves = []
    for impl in ("sdpa", NAME):
        torch.manual_seed(0)
        model = MODELS["llama"]().double()
        model.set_attn_implementation(impl)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        ids = tokens(2)  # one batch, memorised: the loss must fall
        losses = []
        for _ in range(30):
            loss = model(ids, labels=ids, use_cache=False).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(torch.tensor(losses, dtype=torch.float64))
    assert curves[1][-1] < curves[1][0]
    torch.testing.assert_close(curves[1], curves[0], rtol=1e-8, atol=1e-9)


def test_varlen_metadata_is_built_once_per_forward_and_mask(monkeypatch):
    builds = []
    real = adt.varlen_from_key_mask

    def counting(mask, seqlen_q):
        builds.append(seqlen_q)
        return real(mask, seqlen_q)

    monkeypatch.setattr(adt, "varlen_from_key_mask", counting)
    _, ours = make_pair("llama", torch.float64)
    ours(tokens(3), attention_mask=padding("left"), use_cache=False)
    assert builds == [S]  # two layers, one build


def _with_cache(model, cache) -> dict:
    """The keyword a model's forward takes its KV cache by: ``cache`` on the transformers
    releases that deprecate ``past_key_values`` (which then warn), else ``past_key_values``."""
    accepted = inspect.signature(model.forward).parameters
    return {"cache" if "cache" in accepted else "past_key_values": cache}


def test_decode_step_compiles_with_fullgraph():
    _, ours = make_pair("llama", torch.float32)
    ours.eval()
    ids = tokens(2)
    with torch.no_grad():
        prefill = ours(ids[:, :-1], use_cache=True)
        cache = prefill.past_key_values
        expected = ours(ids[:, -1:], **_with_cache(ours, copy.deepcopy(cache))).logits
        torch._dynamo.reset()
        step = torch.compile(ours, backend="eager", fullgraph=True)
        got = step(ids[:, -1:], **_with_cache(ours, copy.deepcopy(cache))).logits
    torch.testing.assert_close(got, expected, **TOL[torch.float32])


def test_padded_training_forward_compiles():
    theirs, ours = make_pair("llama", torch.float32)
    ids, mask = tokens(3), padding("right")
    labels = real_labels(ids, mask)
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend="eager")
    assert_match(
        run(theirs, ids, mask, labels),
        run(compiled, ids, mask, labels),
        TOL[torch.float32],
        where=mask.bool(),
    )


# ----------------------------------------------------------------------------------------------
# What is refused, and how


def test_attention_dropout_is_refused():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**COMMON, num_key_value_heads=2, attention_dropout=0.1))
    model.set_attn_implementation(NAME)
    model.train()
    with pytest.raises(ValueError, match="attention dropout"):
        model(tokens(1), use_cache=False)


def test_4d_mask_is_refused():
    _, ours = make_pair("llama", torch.float32)
    mask = torch.zeros(1, 1, S, S)
    with pytest.raises(ValueError, match="4-D attention mask"):
        ours(tokens(1), attention_mask=mask, use_cache=False)


def layer_inputs(bhsd: bool = True):
    _, ours = make_pair("llama", torch.float32)
    module = ours.model.layers[0].self_attn
    q, k = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8)
    if not bhsd:
        q, k = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    return module, q, k, k.clone()


def test_attention_sinks_under_another_name_are_refused():
    module, q, k, v = layer_inputs()
    with pytest.raises(ValueError, match="attention sinks passed as 'sinks'"):
        adt.attention_forward(module, q, k, v, None, sinks=torch.zeros(4))


def test_s_aux_is_validated_as_the_sinks_of_attention():
    module, q, k, v = layer_inputs()
    with pytest.raises(ValueError, match=r"argument 'sinks': expected shape \(4,\)"):
        adt.attention_forward(module, q, k, v, None, s_aux=torch.zeros(2))


def test_s_aux_is_each_rows_extra_logit():
    """The layer's output with sinks is the dense attention with sinks, and differs from the
    output without them."""
    module, q, k, v = layer_inputs()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    got, _ = adt.attention_forward(module, q, k, v, None, s_aux=sinks)
    want = ad.attention(
        *(t.transpose(1, 2) for t in (q, k, v)),
        causal=True,
        causal_align="bottom_right",
        sinks=sinks,
    )
    torch.testing.assert_close(got, want)
    plain, _ = adt.attention_forward(module, q, k, v, None)
    assert not torch.allclose(got, plain)


def test_bshd_tensors_are_caught_not_guessed():
    module, q, k, v = layer_inputs(bhsd=False)
    with pytest.raises(ValueError, match="argument 'query': expected BHSD"):
        adt.attention_forward(module, q, k, v, None)


def test_bidirectional_sliding_window_is_refused():
    module, q, k, v = layer_inputs()
    with pytest.raises(ValueError, match="bidirectional sliding-window"):
        adt.attention_forward(module, q, k, v, None, sliding_window=3, is_causal=False)


def test_bhsd_output_is_the_dense_attention_of_bshd_views():
    module, q, k, v = layer_inputs()
    out, weights = adt.attention_forward(module, q, k, v, None, scaling=0.3)
    assert weights is None
    want = ad.attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, scale=0.3
    )
    torch.testing.assert_close(out, want)


def mask_call(pattern, **kw):
    args = dict(batch_size=1, q_length=4, kv_length=4, mask_function=pattern, device="cpu")
    return adt.mask_function(**(args | kw))


def test_unsupported_mask_patterns_are_refused():
    from transformers.masking_utils import (
        causal_mask_function,
        chunked_causal_mask_function,
        or_masks,
        sliding_window_causal_mask_function,
    )

    assert mask_call(causal_mask_function) is None
    assert mask_call(sliding_window_causal_mask_function(3)) is None
    with pytest.raises(ValueError, match="chunked attention"):
        mask_call(chunked_causal_mask_function(2, torch.zeros(1, dtype=torch.long)))
    with pytest.raises(ValueError, match="custom mask functions"):
        mask_call(or_masks(causal_mask_function, causal_mask_function), use_vmap=True)

    def my_pattern(b, h, q, kv):
        return kv <= q

    with pytest.raises(ValueError, match="my_pattern"):
        mask_call(my_pattern)


def test_mask_function_keeps_padding_and_drops_all_real_masks():
    from transformers.masking_utils import causal_mask_function

    full = torch.ones(2, 6, dtype=torch.bool)
    assert mask_call(causal_mask_function, batch_size=2, attention_mask=full, kv_length=6) is None
    padded = full.clone()
    padded[1, :2] = False
    got = mask_call(causal_mask_function, batch_size=2, attention_mask=padded, kv_length=5)
    assert torch.equal(got, padded[:, -5:])
    # static cache: 6 of 9 slots written; the mask trims the keys
    got = mask_call(causal_mask_function, batch_size=2, attention_mask=full, kv_length=9)
    assert got.shape == (2, 6)


@pytest.mark.parametrize("name", ["flash_mine", "eager", "sdpa", "org/kernel", "paged|x", ""])
def test_register_refuses_names_transformers_interprets(name):
    with pytest.raises(ValueError, match="argument 'name'"):
        adt.register(name)


# ----------------------------------------------------------------------------------------------
# Packed documents in training (no cache), on every admitted transformers


DOCS = (7, 4, 1)


def packed_inputs(lens=DOCS) -> dict:
    """Restarting position_ids of documents ``lens`` in one row, and the same as cu_seq_lens_*."""
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    position_ids = torch.cat([torch.arange(n) for n in lens])[None]
    flat = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lens), max_length_k=max(lens))
    return {"position_ids": position_ids, "flattening": flat}


@pytest.mark.parametrize("route", ["position_ids", "flattening"])
@pytest.mark.parametrize("name", [n for n in MODELS if n not in EAGER_ONLY])
def test_packed_training_without_cache_matches_reference(name, route):
    """Forward and backward of a packed row with use_cache=False (the training call): logits,
    loss and every gradient as transformers' own attention computes them. With no cache,
    transformers' sdpa/eager separate the documents from the position_ids themselves; the
    DataCollatorWithFlattening route passes cu_seq_lens_* along with the position_ids."""
    dtype = torch.float64
    theirs, ours = make_pair(name, dtype)
    ids = tokens(1)
    inputs = packed_inputs()
    extra = {"position_ids": inputs["position_ids"]}
    if route == "flattening":
        extra |= inputs["flattening"]
    theirs.train(), ours.train()
    a = run(theirs, ids, labels=ids, position_ids=inputs["position_ids"])
    b = run(ours, ids, labels=ids, **extra)
    assert_match(a, b, reference(name, dtype)[1])
    # the documents are separated: not what one unpacked row gives
    dense = run(ours, ids, labels=ids)
    assert not torch.allclose(dense[0], b[0])


@pytest.mark.parametrize("route", ["position_ids", "flattening"])
def test_gpt_oss_packed_training_matches_documents_run_alone(route):
    """GPT-OSS's own masks ignore position_ids (its eager attends across packed documents), so
    the reference is each document run alone by eager: logits, and the gradient of every
    parameter, sinks included, under a loss linear in the logits (so that the packed row's
    gradient is the sum of the documents')."""
    dtype = torch.float64
    theirs, ours = make_pair("gpt_oss", dtype)
    ids = tokens(1)
    inputs = packed_inputs()
    extra = {"position_ids": inputs["position_ids"]}
    if route == "flattening":
        extra |= inputs["flattening"]
    weights = torch.randn(1, S, VOCAB, dtype=dtype, generator=torch.Generator().manual_seed(2))
    theirs.train(), ours.train()
    alone = []
    for doc, w in zip(ids.split(DOCS, dim=1), weights.split(DOCS, dim=1)):
        logits = theirs(doc, use_cache=False).logits
        (logits * w).sum().backward()  # the gradients of the documents add up
        alone.append(logits.detach())
    packed = ours(ids, use_cache=False, **extra).logits
    (packed * weights).sum().backward()
    tol = TOL[dtype]
    torch.testing.assert_close(packed.detach(), torch.cat(alone, 1), **tol)
    mine = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        assert mine[name].grad is not None, name
        torch.testing.assert_close(mine[name].grad, p.grad, **tol, msg=name)
    assert any(n.endswith("sinks") for n in mine)


def test_remapped_packed_patterns_are_judged_by_what_they_wrap():
    """Newer transformers wrap a packed row's pattern so it reads positions within documents;
    that is exact for causal and sliding patterns, and a refused pattern stays refused."""
    from transformers import masking_utils as mu

    remap = getattr(mu, "remap_positions_for_packed_sequence", None)
    if remap is None:
        pytest.skip(f"transformers {transformers.__version__} does not remap packed positions")
    pos = packed_inputs()["position_ids"][:, :4]
    for ok in (mu.causal_mask_function, mu.sliding_window_causal_mask_function(3)):
        assert mask_call(remap(ok, pos)) is None
    chunked = mu.chunked_causal_mask_function(2, torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="chunked attention"):
        mask_call(remap(chunked, pos))


# ----------------------------------------------------------------------------------------------
# Cached metadata never outlives the data it was built from


class Refill:
    """A buffer refilled in place in a way torch's version counter does not see."""

    def __init__(self, route: str, first: torch.Tensor):
        self.route = route
        if route == "inference_mode":  # inference tensors have no version counter
            with torch.inference_mode():
                self.buf = first.clone()
        elif route == "numpy":  # written through a numpy view
            self.array = first.numpy().copy()
            self.buf = torch.from_numpy(self.array)
        else:  # written through .data, which has a version counter of its own
            self.buf = first.clone()

    def context(self):
        return torch.inference_mode() if self.route == "inference_mode" else torch.no_grad()

    def fill(self, new: torch.Tensor) -> None:
        if self.route == "inference_mode":
            with torch.inference_mode():
                self.buf.copy_(new)
        elif self.route == "numpy":
            self.array[...] = new.numpy()
        else:
            self.buf.data.copy_(new)


REFILLS = ["inference_mode", "numpy", "data"]


def _logits_after_refill(route, ids, name: str, first, second) -> tuple:
    """(got, want): a llama's logits with the model input ``name`` refilled in place from
    ``first`` to ``second`` (by ``route``) after one forward, and with ``second`` given afresh."""
    _, ours = make_pair("llama", torch.float64)
    with torch.no_grad():
        want = ours(ids, **{name: second.clone()}, use_cache=False).logits
    refill = Refill(route, first)
    with refill.context():
        ours(ids, **{name: refill.buf}, use_cache=False)
        refill.fill(second)
        got = ours(ids, **{name: refill.buf}, use_cache=False).logits
    return got, want


@pytest.mark.parametrize("route", REFILLS)
def test_refilled_position_ids_are_read_again(route):
    first, second = (packed_inputs(lens)["position_ids"] for lens in (DOCS, (3, 9)))
    got, want = _logits_after_refill(route, tokens(1), "position_ids", first, second)
    torch.testing.assert_close(got, want, **TOL[torch.float64])


@pytest.mark.parametrize("route", REFILLS)
def test_refilled_mask_passed_straight_to_attention_forward_is_read_again(route):
    module, q, k, v = layer_inputs()
    first = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    second = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    with torch.no_grad():
        want = adt.attention_forward(module, q, k, v, second.clone())[0]
    refill = Refill(route, first)
    with refill.context():
        adt.attention_forward(module, q, k, v, refill.buf)
        refill.fill(second)
        got = adt.attention_forward(module, q, k, v, refill.buf)[0]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("route", REFILLS)
def test_refilled_position_ids_passed_straight_to_attention_forward_are_read_again(route):
    """No mask function runs between direct calls: a layer asking again starts a new entry."""
    module, q, k, v = layer_inputs()
    first = torch.tensor([[0, 1, 2, 3, 4, 5]])
    second = torch.tensor([[0, 1, 0, 1, 2, 3]])
    with torch.no_grad():
        want = adt.attention_forward(module, q, k, v, None, position_ids=second.clone())[0]
    refill = Refill(route, first)
    with refill.context():
        adt.attention_forward(module, q, k, v, None, position_ids=refill.buf)
        refill.fill(second)
        got = adt.attention_forward(module, q, k, v, None, position_ids=refill.buf)[0]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("route", REFILLS)
def test_refilled_attention_mask_between_forwards_is_read_again(route):
    first, second = padding("left"), padding("right")
    got, want = _logits_after_refill(route, tokens(3), "attention_mask", first, second)
    real = second.bool()
    torch.testing.assert_close(got[real], want[real], **TOL[torch.float64])


def test_packed_metadata_is_built_once_per_forward(monkeypatch):
    builds = []
    real = adt.varlen_from_position_ids

    def counting(position_ids):
        builds.append(position_ids.shape)
        return real(position_ids)

    monkeypatch.setattr(adt, "varlen_from_position_ids", counting)
    _, ours = make_pair("llama", torch.float64)
    position_ids = packed_inputs()["position_ids"]
    for _ in range(2):  # two layers per forward, one build per forward
        ours(tokens(1), position_ids=position_ids, use_cache=False)
    assert len(builds) == 2


# ----------------------------------------------------------------------------------------------
# Sliding windows over padding


def mistral_window_4():
    torch.manual_seed(0)
    theirs = MistralForCausalLM(MistralConfig(**COMMON, num_key_value_heads=2, sliding_window=4))
    theirs = theirs.double()
    ours = copy.deepcopy(theirs)
    theirs.set_attn_implementation("sdpa")
    ours.set_attn_implementation(NAME)
    return theirs, ours


def test_window_over_padding_inside_a_row_is_refused():
    _, ours = mistral_window_4()
    mask = torch.ones(2, S, dtype=torch.long)
    mask[0, 3:5] = 0
    with pytest.raises(ValueError, match=r"sliding window \(sliding_window=4\).*padding between"):
        ours(tokens(2), attention_mask=mask, use_cache=False)


@pytest.mark.parametrize("holes", ["left", "right", "inside_short_row"])
def test_window_over_contiguous_padding_matches_sdpa(holes):
    """Left/right padding keeps each row's real tokens contiguous; a row with a hole that spans
    no more than the window is exact too (the window hides nothing in it)."""
    theirs, ours = mistral_window_4()
    mask = padding(holes) if holes != "inside_short_row" else torch.zeros(3, S, dtype=torch.long)
    if holes == "inside_short_row":
        mask[0] = 1
        mask[1, [0, 1, 3]] = 1  # span 4 == window
        mask[2, 5:] = 1
    ids = tokens(3)
    labels = real_labels(ids, mask)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    a = run(theirs, ids, mask, labels, position_ids=pos)
    b = run(ours, ids, mask, labels, position_ids=pos)
    assert_match(a, b, TOL[torch.float64], where=mask.bool())


@pytest.mark.parametrize(
    ("kw", "core"),
    [
        (dict(softcap="2.0"), dict(softcap="2.0")),
        (dict(softcap=True), dict(softcap=True)),
        (dict(scaling="0.5"), dict(scale="0.5")),
    ],
)
def test_options_are_refused_as_attention_refuses_them(kw, core):
    module, q, k, v = layer_inputs()
    with pytest.raises(TypeError) as want:
        ad.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **core)
    with pytest.raises(TypeError) as got:
        adt.attention_forward(module, q, k, v, None, **kw)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        (dict(sliding_window="4"), TypeError, "argument 'sliding_window': expected an int"),
        (dict(sliding_window=True), TypeError, "argument 'sliding_window': expected an int"),
        (dict(sliding_window=2.5), TypeError, "argument 'sliding_window': expected an int"),
        (dict(sliding_window=0), ValueError, "argument 'sliding_window': expected an int >= 1"),
        (dict(is_causal="no"), TypeError, "argument 'is_causal': expected a bool"),
    ],
)
def test_transformers_arguments_of_the_wrong_type_are_refused(kw, error, match):
    module, q, k, v = layer_inputs()
    with pytest.raises(error, match=match):
        adt.attention_forward(module, q, k, v, None, **kw)


def _gpt_oss_gpu_model() -> GptOssForCausalLM:
    """A small GPT-OSS (head dim 64, window 128) with random sinks, float32 on the CPU."""
    torch.manual_seed(0)
    return _gpt_oss_with_sinks(
        vocab_size=256,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        sliding_window=128,
        pad_token_id=0,
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
@pytest.mark.parametrize("batch", ["dense", "padded"])
def test_gpt_oss_bf16_on_a_gpu_is_as_close_to_float32_as_eager(batch):
    """bf16 GPT-OSS (head dim 64, window 128 < S) through attn_dispatch's GPU backends: logits
    and gradients (sinks included) no further from the float32 eager model than bf16 eager is
    (within a factor 2, plus a small floor)."""
    base = _gpt_oss_gpu_model()
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 256, (2, 384), generator=gen).cuda()
    mask = None
    if batch == "padded":
        mask = torch.ones_like(ids)
        mask[1, :100] = 0  # left padding
    labels = ids if mask is None else ids.masked_fill(mask == 0, -100)

    def step(dtype, impl):
        model = copy.deepcopy(base).to(device="cuda", dtype=dtype)
        model.set_attn_implementation(impl)
        out = model(ids, attention_mask=mask, labels=labels, use_cache=False)
        out.loss.backward()
        grads = {n: p.grad.float() for n, p in model.named_parameters() if "sinks" in n}
        return out.logits.float(), grads

    want, want_grads = step(torch.float32, "eager")
    real = slice(None) if mask is None else mask.bool()
    results = {impl: step(torch.bfloat16, impl) for impl in ("eager", NAME)}

    def err(got, ref):
        return ((got - ref).abs().max() / ref.abs().max()).item()

    eager, ours = results["eager"], results[NAME]
    assert err(ours[0][real], want[real]) <= 2 * err(eager[0][real], want[real]) + 1e-3
    for name, ref in want_grads.items():
        assert err(ours[1][name], ref) <= 2 * err(eager[1][name], ref) + 1e-2, name


def _decoded_logits(base, dtype, impl, prompt, steps, device="cuda"):
    """The last position's logits after the prompt and after each of ``steps``' tokens, fed one
    at a time through the KV cache (the queries are the last row of the keys: bottom-right)."""
    model = copy.deepcopy(base).to(device=device, dtype=dtype).eval()
    model.set_attn_implementation(impl)
    with torch.no_grad():
        out = model(prompt, use_cache=True)
        logits, past = [out.logits[:, -1].float()], out.past_key_values
        for t in range(steps.shape[1]):
            out = model(steps[:, t : t + 1], **_with_cache(model, past), use_cache=True)
            logits.append(out.logits[:, -1].float())
            past = out.past_key_values
    return torch.stack(logits, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_gpt_oss_bf16_decoding_on_a_gpu_is_as_close_to_float32_as_eager():
    """Generation's attention (a prompt longer than the window, then one token at a time through
    the KV cache, sinks included) in bf16: no further from float32 eager than bf16 eager is."""
    base = _gpt_oss_gpu_model()
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(3, 256, (2, 200), generator=gen).cuda()
    steps = torch.randint(3, 256, (2, 8), generator=gen).cuda()
    want = _decoded_logits(base, torch.float32, "eager", prompt, steps)
    eager = _decoded_logits(base, torch.bfloat16, "eager", prompt, steps)
    ours = _decoded_logits(base, torch.bfloat16, NAME, prompt, steps)

    def err(got):
        return ((got - want).abs().max() / want.abs().max()).item()

    assert err(ours) <= 2 * err(eager) + 1e-3, (err(ours), err(eager))


def _bart_pair():
    """A tiny BART (encoder, decoder, cross-attention) on eager and on attn_dispatch."""
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        init_std=0.5,
    )
    theirs = BartForConditionalGeneration(config).double().eval()
    theirs.set_attn_implementation("eager")
    ours = copy.deepcopy(theirs)
    ours.set_attn_implementation(NAME)
    return theirs, ours


@pytest.mark.parametrize("decoder_len", [5, 11], ids=["decoder shorter", "decoder longer"])
def test_cross_attention_over_a_padded_encoder_matches_eager(decoder_len):
    """The encoder's padding mask pads the keys of cross-attention; its queries (the decoder's
    tokens) are another sequence and all real. Taken as the tail of the keys' rows, the last
    decoder rows read zeros where the encoder row is right-padded."""
    theirs, ours = _bart_pair()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, 8), generator=gen)
    decoder_ids = torch.randint(3, VOCAB, (2, decoder_len), generator=gen)
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    outs = []
    for model in (theirs, ours):
        model.zero_grad()
        logits = model(
            input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids, use_cache=False
        ).logits
        logits.square().mean().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        outs.append((logits.detach(), grads))
    torch.testing.assert_close(outs[1][0], outs[0][0])
    for got, want in zip(outs[1][1], outs[0][1]):
        torch.testing.assert_close(got, want)
    generated = [
        m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
        for m in (theirs, ours)
    ]
    assert torch.equal(generated[0], generated[1])


def _host_waits(model, ids) -> list[str]:
    """The synchronizing CUDA calls of one training step of ``model`` (after a warm one)."""

    def step():
        model(ids, labels=ids, use_cache=False).loss.backward()

    step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return [str(w.message) for w in caught if "synchroniz" in str(w.message)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_a_dense_training_step_waits_for_the_gpu_once_more_than_sdpa_at_most():
    """A waiting host exposes its work between the kernels: a dense step through attn_dispatch
    may wait for the GPU once beyond sdpa's route (reading ``position_ids`` for packed
    documents, once per forward, shared by the layers), no more."""
    torch.manual_seed(0)
    model = MODELS["llama"]().to(device="cuda", dtype=torch.bfloat16).train()
    ids = torch.randint(3, VOCAB, (2, 64), generator=torch.Generator().manual_seed(1)).cuda()
    model.set_attn_implementation("sdpa")
    theirs = _host_waits(model, ids)
    model.set_attn_implementation(NAME)
    ours = _host_waits(model, ids)
    assert len(ours) <= len(theirs) + 1, (theirs, ours)
