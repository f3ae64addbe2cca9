"""Every config field has a decided place in a run's identity (configs/identity.py), so adding one cannot change
every existing run id unnoticed: a field is hashed (one of `HASHED` below, the fields the identity has held since
before `ADDED` existed), added later with the value earlier runs computed with (`ADDED`, out of the hash at that
value), or excluded with a reason (`EXCLUDED`). A field in none of them fails here, and so does a field removed from
the schema without being `RETIRED`."""

from __future__ import annotations

import typing
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from sage.configs.identity import ADDED, EXCLUDED, RETIRED
from sage.configs.schema import SageConfig

pytestmark = pytest.mark.fast

#: The fields hashed into every run id at their value (`section.field`, a nested model's fields below it, a list
#: of models' item fields as `name[].field`). Extend it only for a field whose every value, the default too,
#: should make a new run: otherwise the field belongs in `ADDED`.
HASHED = frozenset({
    "run.seed", "run.snapshot", "model.name", "model.backend", "model.dtype", "model.max_model_len",
    "roles.challenger.max_new_tokens", "roles.challenger.temperature", "roles.challenger.top_p",
    "roles.challenger.constrain", "roles.challenger.unconstrained", "roles.planner.max_new_tokens",
    "roles.planner.temperature", "roles.planner.top_p", "roles.planner.constrain", "roles.planner.unconstrained",
    "roles.critic.max_new_tokens", "roles.critic.temperature", "roles.critic.top_p", "roles.critic.constrain",
    "roles.critic.unconstrained", "roles.solver.max_new_tokens", "roles.solver.temperature", "roles.solver.top_p",
    "roles.solver.constrain", "roles.solver.unconstrained", "iteration.n_challenge", "iteration.n_probe",
    "iteration.n_plan", "iteration.n_solve", "iteration.alpha", "iteration.beta", "iteration.domains",
    "iteration.math_labels", "iteration.near_duplicate_threshold", "iteration.shingle_words",
    "iteration.minhash_permutations", "rewards.planner_critic", "rewards.planner_format", "rewards.solver_plan",
    "rewards.solver_gt", "rewards.solver_format", "rewards.group_by", "rewards.eps", "train.enabled",
    "train.lora_rank", "train.lora_alpha", "train.lora_dropout", "train.lr", "train.clip_eps_low",
    "train.clip_eps_high", "train.kl_beta", "train.loss_type", "train.loss_weighting", "train.roles",
    "train.minibatch_size", "train.grad_accum", "train.max_grad_norm", "train.mmap_threshold_kb",
    "train.accelerate_config", "train.report_to", "validate.n_math", "validate.n_code", "validate.max_new_tokens",
    "sandbox.timeout_s", "sandbox.cpu_s", "sandbox.memory_mb", "sandbox.max_output_bytes", "sandbox.max_procs",
    "mathcheck.timeout_s", "mathcheck.memory_mb", "mathcheck.max_answer_chars", "seeds.source",
    "seeds.sets[].dataset", "seeds.sets[].path", "seeds.sets[].n", "seeds.sets[].split", "seeds.n_math",
    "seeds.n_code", "seeds.math_generators", "seeds.seed", "seeds.skip_bad",
})


def _model(annotation) -> tuple[type[BaseModel], str] | None:
    """The config model inside an annotation (`RoleConfig`, `list[SeedSetConfig]`, `X | None`), with `[]` for a
    list of them; None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    for arg in typing.get_args(annotation):
        found = _model(arg)
        if found:
            return found[0], "[]" if typing.get_origin(annotation) is list else found[1]
    return None


def fields(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every value field of the schema as a dotted path, nested models walked down to their fields."""
    for name, info in model.model_fields.items():
        found = _model(info.annotation)
        if found:
            yield from fields(found[0], f"{prefix}{name}{found[1]}.")
        else:
            yield f"{prefix}{name}"


def _excluded(path: str) -> bool:
    return any(path == e or path.startswith(e + ".") for e in EXCLUDED)


def test_every_config_field_is_hashed_added_or_excluded():
    every = set(fields(SageConfig))
    undecided = sorted(f for f in every if f not in HASHED and f not in ADDED and not _excluded(f))
    assert undecided == [], (
        f"{', '.join(undecided)}: decide its place in a run's identity (configs/identity.py): ADDED at the value "
        f"every earlier run computed with when it decides rows (or every run id changes), EXCLUDED with its reason "
        f"when it decides none")
    named = every | {f.rsplit(".", k)[0].removesuffix("[]") for f in every for k in range(1, f.count(".") + 1)}
    gone = sorted((HASHED | set(ADDED)) - named - set(RETIRED))
    assert gone == [], f"{', '.join(gone)}: no longer in the schema; list it in configs/identity.py RETIRED"
    assert not HASHED & set(ADDED) and not any(_excluded(f) for f in HASHED | set(ADDED))


def test_a_field_in_no_list_fails_the_contract(monkeypatch):
    """The walk sees a field added to a nested model, and the contract names it."""
    from sage.configs import schema

    role = schema.RoleConfig
    monkeypatch.setitem(role.model_fields, "repetition_penalty", role.model_fields["top_p"])
    with pytest.raises(AssertionError, match=r"roles\.challenger\.repetition_penalty, .*: decide its place"):
        test_every_config_field_is_hashed_added_or_excluded()
