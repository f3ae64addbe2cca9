"""The `hf` backend on the tiny random model (fp32): determinism, sampling, log-probs, regex, adapters."""

from __future__ import annotations

import contextlib
import os
import re

import pytest
import torch

from sage.configs.schema import ModelConfig
from sage.engines.llm import GenRequest, load_llm
from sage.engines.llm import hf as hf_module
from sage.engines.llm.hf import HFLLM, Row, layout
from sage.engines.llm.hf_fast import FUSE_MAX_ROWS

SCORE_RX = r"<score>(10|[1-9])</score>"


def _msgs(text: str) -> list[dict]:
    return [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": text}]


PROMPTS = ["What is 7 * 8?", "Write a function def add(a, b): return a + b", "<plan>1. Read.</plan> ok",
           "abc", "Compute 12 + 30. Then check the answer twice, and box it."]


@pytest.fixture(scope="module")
def sharp_model(tiny_model, tmp_path_factory):
    """The tiny model with larger random weights, so greedy outputs are varied rather than one repeated token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("sharp-model")
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.6 if "embed" in name else 0.25))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def llm(sharp_model):
    return load_llm(ModelConfig(name=str(sharp_model), dtype="float32"))


def _tokens(results):
    return [[c.token_ids for c in r.completions] for r in results]


def test_load_llm_builds_hf_backend_with_chat_template(llm):
    assert isinstance(llm, HFLLM) and llm.fast and llm.dtype == torch.float32
    assert llm.adapter is None and llm.tokenizer.eos_token_id in llm.eos_ids
    res = llm.generate([GenRequest(_msgs("hi"), max_new_tokens=3, temperature=0)])[0]
    assert res.prompt_text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nhi<|im_end|>" in res.prompt_text
    assert res.prompt_ids == llm.tokenizer(res.prompt_text, add_special_tokens=False)["input_ids"]


def test_greedy_batched_equals_one_by_one_and_transformers_generate(llm):
    reqs = [GenRequest(_msgs(p), max_new_tokens=12, temperature=0) for p in PROMPTS]
    batched = _tokens(llm.generate(reqs))
    alone = [_tokens(llm.generate([r]))[0] for r in reqs]
    assert batched == alone
    assert len({tuple(t[0]) for t in batched}) > 1, "outputs should differ between prompts"
    for req, toks in zip(reqs, batched):  # the reference decoder: transformers' own greedy generate
        ids = torch.tensor([llm.generate([req])[0].prompt_ids])
        ref = llm.base.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                eos_token_id=llm.eos_ids, pad_token_id=llm.pad_id)[0, ids.shape[1]:].tolist()
        ref = ref[: ref.index(llm.eos_ids[0]) + 1] if llm.eos_ids[0] in ref else ref
        assert toks[0] == ref


def test_generic_forward_path_matches_fast_path(llm):
    reqs = [GenRequest(_msgs(p), n=2, max_new_tokens=10, temperature=1.0, seed=3) for p in PROMPTS[:3]]
    fast = llm.generate(reqs)
    llm.fast = False
    try:
        slow = llm.generate(reqs)
    finally:
        llm.fast = True
    _assert_same(fast, slow, abs=1e-4)


def _assert_same(results_a, results_b, abs: float) -> None:
    """Same tokens, and log-probs equal within `abs`."""
    assert _tokens(results_a) == _tokens(results_b)
    for a, b in zip(results_a, results_b):
        for ca, cb in zip(a.completions, b.completions):
            assert ca.logprobs == pytest.approx(cb.logprobs, abs=abs)


def test_same_seed_same_sample_whatever_the_batch(llm):
    target = GenRequest(_msgs("What is 7 * 8?"), n=3, max_new_tokens=16, temperature=1.0, seed=7)
    others = [GenRequest(_msgs(p), n=2, max_new_tokens=20, temperature=0.8, seed=i) for i, p in enumerate(PROMPTS)]
    alone = _tokens(llm.generate([target]))[0]
    mixed = _tokens(llm.generate(others[:2] + [target] + others[2:]))[2]
    small = HFLLM.__new__(HFLLM)
    small.__dict__.update(llm.__dict__)
    small.cfg = llm.cfg.model_copy(update={"token_budget": 512})  # many small batches
    split = _tokens(small.generate(others + [target]))[-1]
    assert alone == mixed == split
    assert len({tuple(t) for t in alone}) == 3, "the n samples of one request differ"
    other_seed = _tokens(llm.generate([GenRequest(**{**target.__dict__, "seed": 8})]))[0]
    assert other_seed != alone
    first_two = _tokens(llm.generate([GenRequest(**{**target.__dict__, "n": 2})]))[0]
    assert first_two == alone[:2], "sample j does not depend on n"


def test_the_samples_of_a_request_prefill_their_prompt_once(llm, monkeypatch):
    """Rows with the same prompt (the n samples of one request) run it through the layers once and copy its keys,
    values and logits to each: the same tokens and log-probs as prefilling every row, from one prompt pass
    per request (prompts of different lengths, so some are left-padded)."""
    reqs = [GenRequest(_msgs(p), n=n, max_new_tokens=12, temperature=1.0, seed=i)
            for i, (p, n) in enumerate(zip(PROMPTS, [3, 1, 2, 4, 2]))]
    prefilled = []
    forward = HFLLM._forward

    def counting(self, ids, positions, keymask, state, start, end):
        if start == 0:
            prefilled.append(ids.shape[0])
        return forward(self, ids, positions, keymask, state, start, end)

    monkeypatch.setattr(HFLLM, "_forward", counting)
    shared = llm.generate(reqs)
    assert prefilled == [len(reqs)]  # one batch, one row per request
    prefilled.clear()
    monkeypatch.setattr(HFLLM, "_prefill", lambda self, ids, positions, keymask, state, P, shared:
                        self._forward(ids, positions, keymask, state, 0, P))
    every_row = llm.generate(reqs)
    assert prefilled == [sum(r.n for r in reqs)]
    _assert_same(shared, every_row, abs=1e-5)
    assert len({tuple(c.token_ids) for c in shared[3].completions}) == 4, "the samples still differ"


LONG_SYSTEM = ("You are the Solver. Think step by step, then give the final answer between answer tags. "
               "Example: what is 2 + 3? <think>2 plus 3 is 5.</think><answer>5</answer> Keep it short.")


def _long(text: str) -> list[dict]:
    return [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": text}]


@pytest.mark.parametrize("dtype,fused", [("float32", True), ("float32", False), ("bfloat16", True)])
def test_a_prefix_every_prompt_shares_is_prefilled_once_for_the_batch(sharp_model, monkeypatch, dtype, fused):
    """Prompts that share a long prefix (a role's instructions) prefill it once for the whole batch and the rest
    of each prompt after it (padding goes between the two): in float32, through the fused layers or the model's
    own modules, the same tokens as prefilling every row whole and log-probs within rounding; with a request of
    several samples, prompts of different lengths, and greedy and sampled requests in one batch. (In bf16 the
    prefix rounds as a one-row pass does, which may flip a greedy token: only the passes are compared.)"""
    llm = HFLLM(ModelConfig(name=str(sharp_model), dtype=dtype), device="cpu")
    llm._fused_ok = llm._fused_ok and fused
    reqs = [GenRequest(_long(p), n=n, max_new_tokens=12, temperature=t, seed=i)
            for i, (p, n, t) in enumerate(zip(PROMPTS, [1, 3, 1, 2, 1], [0, 1.0, 0, 0.8, 0]))]
    passes = []
    forward = HFLLM._forward

    def counting(self, ids, positions, keymask, state, start, end):
        if ids.shape[1] > 1:
            passes.append((start, *ids.shape))
        return forward(self, ids, positions, keymask, state, start, end)

    monkeypatch.setattr(HFLLM, "_forward", counting)
    shared = llm.generate(reqs)
    ids = [r.prompt_ids for r in shared]
    prefix = len(os.path.commonprefix(ids))
    assert prefix >= hf_module.SHARED_PREFIX_MIN and len({len(i) for i in ids}) > 1
    # the prefix once for one row, then the rest of each distinct prompt after it, from slot `prefix`
    assert passes == [(0, 1, prefix), (prefix, len(reqs), max(map(len, ids)) - prefix)]
    passes.clear()
    monkeypatch.setattr(hf_module, "SHARED_PREFIX_MIN", 10**6)
    whole = llm.generate(reqs)
    assert passes == [(0, len(reqs), max(map(len, ids)))]
    if dtype == "float32":
        _assert_same(shared, whole, abs=5e-5)
    assert len({tuple(c.token_ids) for c in shared[1].completions}) == 3, "the samples still differ"


def test_shared_prefix_edge_layouts_match_each_prompt_alone(llm):
    """Layouts a shared prefix makes (float32: tokens as each prompt alone): prompts of one length (no padding,
    so no key mask), prompts one token apart (the pass after the prefix is one token), one prompt the prefix
    of another, and prefix + [pad id] + rest beside prefix + rest, which lay out to the same ids and must not be
    taken for one prompt."""
    base = llm.generate([GenRequest(_long("x"), max_new_tokens=1)])[0].prompt_ids[:40]
    rest = base[20:30]
    cases = {"one length": [base + rest[:3], base + rest[3:6]],
             "last token differs": [base + rest[:3], base + rest[:2] + rest[4:5]],
             "prefix of another": [base + rest[:1], base + rest[:5]],
             "pad id mid-row": [base + [llm.pad_id] + rest[:3], base + rest[:3]]}

    def run(prompts):
        rows = [Row(i, 0, list(p), 8, 0.0, 1.0, 0, None) for i, p in enumerate(prompts)]
        llm._run_batch(rows)
        return [r.tokens for r in rows]

    for name, prompts in cases.items():
        assert layout([Row(0, 0, p, 8, 0.0, 1.0, 0, None) for p in prompts], max(map(len, prompts)), 8, llm.pad_id)[2] \
            >= hf_module.SHARED_PREFIX_MIN, name
        assert run(prompts) == [run([p])[0] for p in prompts], name


def test_completions_decode_to_text_and_finish_reasons(llm):
    reqs = [GenRequest(_msgs(p), n=3, max_new_tokens=6 + 10 * (i % 2), temperature=1.2, seed=i, top_p=0.9)
            for i, p in enumerate(PROMPTS)]
    for req, res in zip(reqs, llm.generate(reqs)):
        assert len(res.completions) == req.n
        for c in res.completions:
            assert 1 <= len(c.token_ids) <= req.max_new_tokens
            assert llm.tokenizer.decode(c.token_ids, skip_special_tokens=True) == c.text
            if c.finish_reason == "stop":
                assert c.token_ids[-1] in llm.eos_ids
            else:
                assert c.finish_reason == "length" and len(c.token_ids) == req.max_new_tokens
                assert not set(c.token_ids) & set(llm.eos_ids)


def test_logprobs_match_a_forward_pass(llm):
    reqs = [GenRequest(_msgs(p), n=2, max_new_tokens=12, temperature=0.7, seed=11, top_p=0.8) for p in PROMPTS[:3]]
    for res in llm.generate(reqs):
        for c in res.completions:
            assert len(c.logprobs) == len(c.token_ids)
            assert all(torch.isfinite(torch.tensor(c.logprobs))) and max(c.logprobs) <= 0
            _assert_logprobs_of(llm.base, res.prompt_ids, c, temperature=0.7)


def test_logprobs_are_taken_at_each_requests_temperature(llm):
    """Rows of one batch at different temperatures (and a greedy one, at 1) each get their own scale."""
    reqs = [GenRequest(_msgs(PROMPTS[0]), n=1, max_new_tokens=8, temperature=t, seed=3) for t in (0.5, 1.5, 0.0)]
    results = llm.generate(reqs)
    for req, res in zip(reqs, results):
        _assert_logprobs_of(llm.base, res.prompt_ids, res.completions[0], temperature=req.temperature or 1.0)


def _assert_logprobs_of(model, prompt_ids: list[int], c, temperature: float = 1.0) -> None:
    """The completion's log-probs are what a teacher-forced forward pass of `model` at `temperature` gives its
    tokens."""
    ids = torch.tensor([prompt_ids + c.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    ref = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(c.token_ids).view(-1, 1)).view(-1)
    assert c.logprobs == pytest.approx(ref.tolist(), abs=1e-4)


def test_regex_constrains_every_sample(llm):
    reqs = [GenRequest(_msgs(p), n=3, max_new_tokens=24, temperature=1.0, seed=5, regex=SCORE_RX)
            for p in PROMPTS[:2]]
    plain = GenRequest(_msgs("abc"), n=2, max_new_tokens=8, temperature=1.0, seed=5)
    results = llm.generate(reqs + [plain])
    for res in results[:2]:
        for c in res.completions:
            assert c.finish_reason == "stop" and re.fullmatch(SCORE_RX, c.text), c.text
            assert all(torch.isfinite(torch.tensor(c.logprobs)))
    assert not any(re.fullmatch(SCORE_RX, c.text) for c in results[2].completions)


def test_free_samples_are_drawn_without_the_regex_as_an_unconstrained_request_draws_them(llm):
    annealed = GenRequest(_msgs(PROMPTS[0]), n=4, max_new_tokens=8, temperature=1.0, seed=9, regex=SCORE_RX,
                          free=frozenset({1, 3}))
    plain = GenRequest(_msgs(PROMPTS[0]), n=4, max_new_tokens=8, temperature=1.0, seed=9)
    got, ref = (r.completions for r in llm.generate([annealed, plain]))
    assert all(re.fullmatch(SCORE_RX, got[j].text) for j in (0, 2))
    assert [got[j].token_ids for j in (1, 3)] == [ref[j].token_ids for j in (1, 3)]
    with pytest.raises(ValueError, match="free holds completion indices 0..3"):
        GenRequest(_msgs("x"), n=4, regex=SCORE_RX, free=frozenset({4}))


def test_use_adapter_changes_output_and_none_restores_it(llm, sharp_model, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = []
    for k in range(2):  # two adapter "versions" with non-zero B
        torch.manual_seed(100 + k)
        base = AutoModelForCausalLM.from_pretrained(sharp_model, dtype=torch.float32)
        peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=32, target_modules="all-linear",
                                               init_lora_weights=False))
        peft.save_pretrained(tmp_path / f"v{k}")
        paths.append(str(tmp_path / f"v{k}"))
    reqs = [GenRequest(_msgs(p), max_new_tokens=10, temperature=0) for p in PROMPTS[:3]]
    base_out = _tokens(llm.generate(reqs))
    try:
        llm.use_adapter(paths[0])
        assert llm.adapter == paths[0]
        assert llm._fused_ok or llm._fused is None  # LoRA added to the fused matmuls (CPU), unmerged
        v0 = _tokens(llm.generate(reqs))
        llm.use_adapter(paths[1])
        v1 = _tokens(llm.generate(reqs))
        llm.use_adapter(paths[0])
        assert _tokens(llm.generate(reqs)) == v0
        res = llm.generate(reqs[:1])[0]  # log-probs follow the adapted model
        _assert_logprobs_of(llm._peft, res.prompt_ids, res.completions[0])
    finally:
        llm.use_adapter(None)
    assert v0 != base_out and v1 != v0
    assert llm.adapter is None and _tokens(llm.generate(reqs)) == base_out


def test_progress_reports_requests_and_tokens(llm):
    small = HFLLM.__new__(HFLLM)
    small.__dict__.update(llm.__dict__)
    small.cfg = llm.cfg.model_copy(update={"token_budget": 512})
    calls = []
    reqs = [GenRequest(_msgs(p), n=2, max_new_tokens=8, temperature=1.0, seed=1) for p in PROMPTS]
    results = small.generate(reqs, progress=lambda *a: calls.append(a))
    total = sum(len(c.token_ids) for r in results for c in r.completions)
    assert len(calls) > 1 and calls[-1] == (len(reqs), len(reqs), total)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)


def test_rejects_prompt_longer_than_max_model_len(llm):
    short = HFLLM.__new__(HFLLM)
    short.__dict__.update(llm.__dict__)
    short.cfg = llm.cfg.model_copy(update={"max_model_len": 256})
    with pytest.raises(ValueError, match="max_model_len"):
        short.generate([GenRequest(_msgs("abc " * 300))])
    with pytest.raises(ValueError, match="temperature"):
        GenRequest(_msgs("x"), temperature=-1)


@pytest.mark.parametrize("prompts", [PROMPTS, PROMPTS[:1]])  # padded batch (masked attention); one row: no mask
def test_bf16_batched_greedy_equals_transformers_batched_generate(sharp_model, prompts):
    """The fused bf16 path (oneDNN-packed weights on CPUs that have them) keeps transformers' arithmetic."""
    llm = HFLLM(ModelConfig(name=str(sharp_model), dtype="bfloat16"), device="cpu")
    assert llm._fused_ok
    msgs = [_msgs(p) for p in prompts]
    ours = _tokens(llm.generate([GenRequest(m, max_new_tokens=12, temperature=0) for m in msgs]))
    tok = llm.tokenizer
    tok.padding_side = "left"
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                  padding=True)
    with torch.inference_mode():
        out = llm.base.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=llm.eos_ids,
                                pad_token_id=llm.pad_id)[:, enc["input_ids"].shape[1]:].tolist()
    for ref, toks in zip(out, ours):
        cut = next((k + 1 for k, x in enumerate(ref) if x in llm.eos_ids), len(ref))
        assert toks[0] == ref[:cut]


def test_fused_layers_match_the_model_modules(llm):
    reqs = [GenRequest(_msgs(p), n=2, max_new_tokens=10, temperature=1.0, seed=4) for p in PROMPTS[:3]]
    reqs.append(GenRequest(_msgs("abc"), max_new_tokens=10, temperature=0))
    fused, was = llm.generate(reqs), llm._fused_ok
    llm._fused_ok = False
    try:
        modules = llm.generate(reqs)
    finally:
        llm._fused_ok = was
    _assert_same(fused, modules, abs=1e-5)


def test_adapter_peft_cannot_fuse_runs_through_the_modules(llm, sharp_model, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    base = AutoModelForCausalLM.from_pretrained(sharp_model, dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=4, lora_alpha=32, target_modules="all-linear", use_dora=True,
                                    init_lora_weights=False)).save_pretrained(tmp_path / "dora")
    req = GenRequest(_msgs(PROMPTS[0]), max_new_tokens=10, temperature=0)
    base_out = _tokens(llm.generate([req]))
    try:
        llm.use_adapter(str(tmp_path / "dora"))
        assert not llm._fused_ok
        res = llm.generate([req])[0]
        _assert_logprobs_of(llm._peft, res.prompt_ids, res.completions[0])
    finally:
        llm.use_adapter(None)
    assert llm._fused_ok == (llm._fused is not None) and _tokens(llm.generate([req])) == base_out


@pytest.mark.parametrize("vocab", [4096, 1031])  # blocks of 1024; a prime: one block
def test_sampling_helpers_match_their_plain_torch_definitions(vocab):
    from sage.engines.llm.sampling import argmax, inverse_cdf, log_normalizer

    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(6, vocab, generator=gen)
    x[0, 5] = x[0, 3000 % vocab] = 50.0  # a tie: the first index wins
    x[1, vocab // 2:] = float("-inf")
    x[2] = x[2].round()  # many ties
    assert torch.equal(argmax(x), x.argmax(-1))
    assert torch.allclose(log_normalizer(x), torch.logsumexp(x, -1), atol=1e-5)
    weights = torch.softmax(x, -1)
    weights[3, ::2] = 0.0  # never drawn
    cdf = weights.double().cumsum(-1)
    for u in [0.0, 1e-9, 0.25, 0.5, 0.999999, 1 - 2**-53] + torch.rand(20, generator=gen).tolist():
        us = torch.full((6,), u, dtype=torch.float64)
        got = inverse_cdf(weights, us)
        assert bool((weights.gather(-1, got.view(-1, 1)) > 0).all())
        ref = torch.searchsorted(cdf, (us * cdf[:, -1]).view(-1, 1), right=True).view(-1).clamp(max=vocab - 1)
        near = (cdf.gather(-1, got.view(-1, 1)).view(-1) - (us * cdf[:, -1])).abs() < 1e-6  # a rounding tie
        assert bool(((got == ref) | near).all())


def _bf16_with_adapter(sharp_model, tmp_path) -> HFLLM:
    """The sharp model in bf16 with a random (non-zero) rank-4 adapter on every linear layer, fused."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(7)
    base = AutoModelForCausalLM.from_pretrained(sharp_model, dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=4, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
                   ).save_pretrained(tmp_path / "lora")
    llm = HFLLM(ModelConfig(name=str(sharp_model), dtype="bfloat16"), device="cpu")
    llm.use_adapter(str(tmp_path / "lora"))
    assert llm._fused_ok
    return llm


def test_bf16_adapter_computes_in_bf16_on_either_path_as_the_trainer_does(sharp_model, tmp_path):
    """Under a bf16 base the adapter computes in bf16 (`adapter_compute_dtype`): the fused layers (A appended to
    the packed decode matmul, the scaling folded into B) give the tokens and log-probs of the model's own
    modules under the trainer's autocast, and those are not the float32 adapter's. One request at a time, so
    every prefill is short (at most `FUSE_MAX_ROWS` rows) and runs the same matmuls as a decode step; a long
    prefill is the next test's."""
    llm = _bf16_with_adapter(sharp_model, tmp_path)
    reqs = [GenRequest(_msgs(p), n=2, max_new_tokens=10, temperature=1.0, seed=3) for p in PROMPTS[:3]]
    reqs.append(GenRequest(_msgs(PROMPTS[4]), max_new_tokens=10, temperature=0))

    def generate():
        out = [llm.generate([r])[0] for r in reqs]
        assert max(len(r.prompt_ids) * q.n for r, q in zip(out, reqs)) <= FUSE_MAX_ROWS
        return out

    fused = generate()
    llm._fused_ok = False
    try:
        modules = generate()
        llm._adapter_autocast = contextlib.nullcontext  # the modules as PEFT runs them: a float32 adapter
        float32 = generate()
    finally:
        llm._fused_ok = True
        del llm._adapter_autocast
    _assert_same(fused, modules, abs=1e-6)
    assert _tokens(fused) != _tokens(float32)


def test_bf16_adapter_in_a_long_prefill_is_within_a_bf16_rounding_of_the_trainers_autocast(sharp_model, tmp_path):
    """A prefill of more than `FUSE_MAX_ROWS` rows runs each projection group as one matmul with `(x A^T) B^T`
    accumulated into it: per projection within a bf16 rounding of the modules under the trainer's autocast,
    and no farther from the exact (float64) result than they are."""
    llm = _bf16_with_adapter(sharp_model, tmp_path)
    layer, attn = llm._fused.layers[0], llm.base.model.layers[0].self_attn
    x = torch.randn(3, 100, attn.q_proj.in_features, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with torch.no_grad():
        fused = layer.qkv(x)
        llm._fused_ok = False  # the modules as the backend runs them when it cannot fuse: the trainer's autocast
        with llm._adapter_autocast():
            modules = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], -1)
        llm._fused_ok = True

    def exact(m):  # base + B A x * scaling in float64
        w, a, b = (t.double() for t in (m.base_layer.weight, m.lora_A["default"].weight, m.lora_B["default"].weight))
        return x.double() @ w.T + (x.double() @ a.T) @ b.T * m.scaling["default"]

    ref = torch.cat([exact(attn.q_proj), exact(attn.k_proj), exact(attn.v_proj)], -1)
    assert fused.dtype == torch.bfloat16 and fused.shape == modules.shape
    # a rounding of the output's scale (the modules round the base output before the LoRA term is added)
    assert (fused.float() - modules.float()).abs().max() <= 2 ** -6 * modules.float().abs().max()
    assert (fused.double() - ref).abs().mean() <= 1.05 * (modules.double() - ref).abs().mean()
