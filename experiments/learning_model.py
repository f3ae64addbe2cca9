"""The model-side measures of `experiments/learning.py`: how far the policy moved (KL to the base model, log-prob
change of the rollouts with the highest and lowest advantages) and whether it writes the role tags by itself.

`Scorer` teacher-forces stored token ids through the base model in float32, with or without a LoRA adapter
(PEFT, loaded and unloaded as the `hf` generation backend does), so every number here comes from one
forward-pass path whatever dtype the run generated and trained in. `format_rates` samples through the
project's own generation engine, without the output grammar.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext

from sage.configs.names import Role
from sage.engines.llm.base import GenRequest
from sage.stages.prompts import PromptKind
from sage.stages.rollouts import parse, prompt, question_fields
from sage.warehouse import content_id, seed_from_id

#: Prompt kinds of the format measure: one per role and domain, as the stages use them (no plan shown).
FORMAT_KINDS = ("challenger_math", "challenger_code", "planner", "critic_question", "solver_math", "solver_code")


class Scorer:
    """The base model in float32 for teacher forcing; `use(adapter)` puts a LoRA adapter on it (None: none)."""

    def __init__(self, model_path: str):
        import torch
        from transformers import AutoModelForCausalLM

        self.base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.model, self.adapter = self.base, None

    def use(self, adapter: str | None) -> None:
        from sage.engines.llm.models import quiet_v6

        if adapter == self.adapter:
            return
        with quiet_v6():  # peft still reads transformers' deprecated names
            if self.adapter is not None:
                self.base = self.model.unload()  # drops the LoRA layers; the base weights were never touched
            self.model, self.adapter = self.base, None
            if adapter is not None:
                from peft import PeftModel

                self.model, self.adapter = PeftModel.from_pretrained(self.base, adapter).eval(), adapter

    def logits(self, prompt_ids: list[int], completion_ids: list[int], base: bool = False):
        """Float32 logits [C, V] at the positions that predict each of the C completion tokens; `base`: with the
        adapter switched off."""
        import torch

        ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
        off = self.model.disable_adapter() if base and self.adapter is not None else nullcontext()
        with torch.inference_mode(), off:
            out = self.model(input_ids=ids, logits_to_keep=len(completion_ids) + 1)
        return out.logits[0, :-1].float()

    def kl_to_base(self, sequences: list[dict]) -> dict:
        """Mean per-token KL(policy || base) over the completion tokens of `sequences` (prompt_ids,
        completion_ids), full-vocabulary softmax at temperature 1."""
        import torch

        total, tokens, worst = 0.0, 0, 0.0
        for s in sequences:
            if not s["completion_ids"]:
                continue
            lp = torch.log_softmax(self.logits(s["prompt_ids"], s["completion_ids"]), -1)
            lq = torch.log_softmax(self.logits(s["prompt_ids"], s["completion_ids"], base=True), -1)
            kl = (lp.exp() * (lp - lq)).sum(-1).clamp(min=0.0)
            total, tokens, worst = total + float(kl.sum()), tokens + kl.numel(), max(worst, float(kl.max()))
        return {"kl_mean": total / tokens if tokens else None, "kl_max_token": worst, "kl_tokens": tokens,
                "kl_sequences": len(sequences)}

    def token_logprobs(self, row: dict, temperature: float) -> list[float]:
        """log_softmax(logits / T)[token] of each completion token of `row`: what the trainer takes."""
        import torch

        logits = self.logits(row["prompt_ids"], row["completion_ids"]) / temperature
        target = torch.tensor(list(row["completion_ids"])).view(-1, 1)
        return torch.log_softmax(logits, -1).gather(-1, target).view(-1).tolist()


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def logprob_change(scorer: Scorer, rows: list[dict], after: str, temperature_of) -> dict:
    """For each group of `rows` ("top", "bottom"; each row has prompt_ids, completion_ids, role, the adapter
    that sampled it, its stored log-probs): the mean over rows of the per-token mean log-prob change from the
    sampling policy to adapter `after`, both teacher-forced here at the role's sampling temperature. The stored
    behaviour log-probs (bf16 generation) are compared with the teacher-forced "before" as a check."""
    before: dict[str, list[float]] = {}
    for adapter in sorted({r["adapter"] or "" for r in rows}):
        scorer.use(adapter or None)
        for r in rows:
            if (r["adapter"] or "") == adapter:
                before[r["rollout_id"]] = scorer.token_logprobs(r, temperature_of(r["role"]))
    scorer.use(after)
    out: dict = {}
    gaps = []
    for group in ("top", "bottom"):
        chosen = [r for r in rows if r["group"] == group and r["completion_ids"]]
        changes = []
        for r in chosen:
            new, old = scorer.token_logprobs(r, temperature_of(r["role"])), before[r["rollout_id"]]
            changes.append(_mean([a - b for a, b in zip(new, old)]))
            if r["logprobs"] is not None:
                gaps += [abs(a - b) for a, b in zip(old, r["logprobs"])]
        out[f"lp_{group}_change"] = _mean(changes)
        out[f"lp_{group}_n"] = len(chosen)
        out[f"lp_{group}_adv"] = _mean([r["advantage"] for r in chosen])
    out["lp_before_vs_stored"] = _mean(gaps)
    return out


def format_units(questions: dict[str, list[dict]], per_kind: int) -> list[dict]:
    """`per_kind` prompts per kind of FORMAT_KINDS: a domain's kinds take that domain's questions, the Planner
    and the Critic half math, half code (`questions`: domain -> seed questions in a fixed random order)."""
    units = []
    for kind in FORMAT_KINDS:
        domain = kind.rsplit("_", 1)[1] if kind.endswith(("_math", "_code")) else None
        picked = questions[domain][:per_kind] if domain else \
            questions["math"][:per_kind // 2] + questions["code"][:per_kind - per_kind // 2]
        for q in picked:
            # the fields each stage passes: the Challenger sees the reference text alone
            fields = {"question": q["text"]} if kind.startswith("challenger") else question_fields(q)
            units.append({"kind": kind, "role": PromptKind(kind).role, "domain": q["domain"],
                          "question_id": q["question_id"], "fields": fields})
    return units


def format_rates(ctx, units: list[dict], adapter: str | None, seed: int) -> dict:
    """Sample every unit once through the context's generation engine with `adapter`, without the output
    grammar, at the role's temperature and token budget; per role: the share of outputs whose format reward
    r_f is 1 (every required tag, once, non-empty) and the mean r_f. The sample seeds depend on the unit and
    `seed` only, so every iteration draws with the same random numbers."""
    ctx = dataclasses.replace(ctx, adapter=adapter)
    requests = []
    for u in units:
        role = getattr(ctx.cfg.roles, u["role"])
        requests.append(GenRequest(
            messages=prompt(ctx, u["kind"], role.max_new_tokens, **u["fields"]), n=1,
            max_new_tokens=role.max_new_tokens, temperature=role.temperature, top_p=role.top_p,
            seed=seed_from_id(content_id(seed, "learning-format", u["kind"], u["question_id"])), regex=None))
    results = ctx.llm.generate(requests)
    rewards: dict[str, list[float]] = {r.value: [] for r in Role}
    for u, res in zip(units, results):
        rewards[u["role"]].append(parse(u["role"], u["domain"], res.completions[0].text).format_reward)
    out = {}
    for role, rs in rewards.items():
        out[f"format_{role}_rate"] = _mean([1.0 if r == 1.0 else 0.0 for r in rs])
        out[f"format_{role}_mean_rf"] = _mean(rs)
        out[f"format_{role}_n"] = len(rs)
    return out
