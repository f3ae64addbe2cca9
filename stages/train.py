"""train: one TRR++ policy-gradient pass of the shared LoRA adapter over all roles' rollouts together
(`train.roles` can leave roles out): one AdamW update per `minibatch_size * grad_accum` rows, each role weighed by
`train.loss_weighting`. With `train.adapters` per_role, one such pass per role instead, each over its own rollouts
on its own adapter with its own optimizer state (`passes`): the Solver's is the checkpoint, the others' go in its
`roles/` folder, and a listed role without rollouts this iteration keeps the adapter it had (`carry_untrained`).

Reads: this iteration's scored rollouts (prompt and completion token ids, sampling log-probs, advantage; each
trained at its role's sampling temperature, `roles.<role>.temperature`) and the adapter the iteration generated
with (none in iteration 1: a fresh LoRA). Trains through `sage.engines.train.launch` (a TRL GRPOTrainer subclass
fed stored rows), in this process or, with `train.isolate` (the GPU default), in its own process, so generation
and training never hold GPU memory at once; with `train.accelerate_config` under `accelerate launch`,
data-parallel over its processes. A listed role with no rollouts this iteration (the Planner with `iteration.planner`
false) is left out of the update; a config whose `train.roles` only such roles fill is refused when it loads.
Writes: one `train_steps` row per optimizer update as the update ends (with its role under per_role), the adapter to
`<project>/adapters/<run>/iteration-<k>` (atomically; `<project>` is the warehouse's directory, the one the
command was given, never the stored run.dir, so a copied project writes into itself; `<run>` as `run_dirname` maps
it), then a `checkpoints` row with the metrics and `iterations.adapter_out` (the path relative to the project), in
one transaction.
Idempotency: a recorded checkpoint is never retrained; a crash mid-training leaves no checkpoint row, so a
re-run trains that iteration again (and only that), first deleting the steps the interrupted attempt stored.
Retention (`retain`, which `sage run` calls after each iteration and its validation): with `train.keep_last` set,
older adapter directories and optimizer states are deleted by `checkpoints.retention_plan`'s rule and the
deletions recorded in `checkpoints`; a stage that would read one is refused (`checkpoints.check_retained`).
Fails: trainer errors propagate; no scored rollouts to train on raises; a `train.accelerate_config` that names
no file fails before any work.
"""
# pyright: basic

from __future__ import annotations

import shutil
from pathlib import Path

from sage.configs.names import Role, Stage
from sage.engines.train import OPTIMIZER_FILE, ROLES_DIR, launch, role_adapter_dir
from sage.engines.train.rows import TrainRow
from sage.stages.context import RunContext, StageReport
from sage.stages.score import REWARD_VERSION
from sage.warehouse.checkpoints import record_pruned, retention_plan
from sage.warehouse.queries import (
    checkpoint_path,
    clear_train_steps,
    project_dir,
    record_checkpoint,
    record_train_step,
    train_steps_before,
    training_rows,
)
from sage.warehouse.runs import run_dirname

STAGE = Stage.TRAIN


def sampling_temperature(cfg, role: str) -> float:
    """The temperature `role`'s rollouts were sampled at (`roles.<role>.temperature`), which the trainer takes its
    log-probs at. Greedy rollouts (temperature 0) have no tempered distribution; they train at temperature 1."""
    t = float(getattr(cfg.roles, role).temperature)
    return t if t > 0 else 1.0


def sampled_constrained(cfg, row: dict) -> bool:
    """Whether a stored rollout was sampled under its role's grammar: `rollouts.constrained`; for a rollout stored
    before that column (NULL), or a query that does not read it, whether its role had one (`roles.<role>.constrain`;
    grammar annealing came with the column). The trainer does not importance-correct such a rollout."""
    stored = row.get("constrained")
    return bool(getattr(cfg.roles, row["role"]).constrain) if stored is None else bool(stored)


def train_config(cfg):
    """`train` with `old_policy` auto resolved for the backend that sampled the rows: sampler on hf (its stored
    log-probs are the unmasked distribution of the same weights, so pi_old needs no recompute), recompute on
    vllm (its log-probs under a grammar are of the masked distribution)."""
    if cfg.train.old_policy != "auto":
        return cfg.train
    return cfg.train.model_copy(update={"old_policy": "sampler" if cfg.model.backend == "hf" else "recompute"})


def stored_rows(wh, cfg, run_id: str, iteration: int) -> list[TrainRow]:
    """The iteration's scored rollouts of the roles `train.roles` lists, as `TrainRow`s, each at its role's
    sampling temperature and marked constrained when sampled under a grammar. With `train.hinted_prompt` plain, a
    Solver answer that was shown its plan trains on the prompt its question's unhinted answers had (`plain_prompt`)."""
    rows = training_rows(wh, run_id, iteration, REWARD_VERSION, [str(role) for role in cfg.train.roles])
    plain = plain_prompts(rows) if cfg.train.hinted_prompt == "plain" else {}
    return [TrainRow(prompt_ids=list(plain_prompt(r, plain) if plain else r["prompt_ids"]),
                     completion_ids=list(r["completion_ids"]), advantage=float(r["advantage"]),
                     logprobs=None if r["logprobs"] is None else list(r["logprobs"]),
                     role=r["role"], temperature=sampling_temperature(cfg, r["role"]),
                     constrained=sampled_constrained(cfg, r))
            for r in rows]


def plain_prompts(rows: list[dict]) -> dict[str, list[int]]:
    """{question id: prompt ids} of the Solver's answers shown no plan among `rows`."""
    return {r["question_id"]: r["prompt_ids"] for r in rows if r["role"] == Role.SOLVER and r["plan_shown"] is False}


def plain_prompt(row: dict, plain: dict[str, list[int]]) -> list[int]:
    """The prompt `row` trains on under `train.hinted_prompt` plain: a Solver answer shown its plan trains on its
    question's plain prompt (`plain`), every other row on its own. pi_old stays the stored sampling log-probs of the
    answer under the plan, so the clipped ratio is pi(answer | question) / pi_old(answer | question, plan)."""
    if row["role"] != Role.SOLVER or not row["plan_shown"]:
        return row["prompt_ids"]
    if row["question_id"] not in plain:
        raise RuntimeError(f"train: Solver answer {row['rollout_id']} was shown its plan, but question "
                           f"{row['question_id']} has no answer without one to take the plain prompt from "
                           f"(train.hinted_prompt plain needs iteration.hints mixed or on_failure)")
    if row["logprobs"] is None:
        raise RuntimeError(f"train: Solver answer {row['rollout_id']} was shown its plan and has no stored sampling "
                           f"log-probs, which train.hinted_prompt plain takes as pi_old")
    return plain[row["question_id"]]


def adapter_dir(ctx: RunContext) -> Path:
    """Where the iteration's adapter goes: `<project>/adapters/<run>/iteration-<k>`, in the warehouse's project
    directory (a project copied elsewhere keeps a stored run.dir that names the original)."""
    return project_dir(ctx.wh) / "adapters" / run_dirname(ctx.run_id) / f"iteration-{ctx.iteration}"


class _StepWriter:
    """Stores each optimizer update in `train_steps` as the trainer reports it and shows it on the display
    (optimizer steps done of the pass, tokens trained, the update's loss). Under `train.adapters` per_role each
    role's pass numbers its updates on from the passes before it (`offset`) and records its role."""

    def __init__(self, ctx: RunContext):
        self.ctx, self.tokens, self.offset, self.role = ctx, 0, 0, None

    def next_pass(self, role: str | None, offset: int) -> _StepWriter:
        self.role, self.offset = role, offset
        return self

    def __call__(self, step: dict) -> None:
        done, total = step["step"] + self.offset, (step.get("updates") or step["step"]) + self.offset
        step = {**step, "step": done, **({"role": self.role} if self.role else {})}
        record_train_step(self.ctx.wh, self.ctx.run_id, self.ctx.iteration, step)
        self.tokens += step.get("tokens") or 0
        loss = step.get("loss")
        self.ctx.report(STAGE, done, total, self.tokens, unit="steps",
                        note=("" if loss is None else f"loss {loss:.4f}") + (f" ({self.role})" if self.role else ""),
                        metrics=step)


def passes(ctx: RunContext, rows: list[TrainRow], out: Path) -> list[tuple[str | None, list[TrainRow], str | None,
                                                                               Path]]:
    """The training passes of the stage: (role, its rows, the adapter it starts from, where it goes). `shared`: one
    pass over every row, role None. `per_role`: one pass per role with rows, the Solver's first (its directory,
    `out`, holds the others' in `roles/`), each from that role's adapter of the iteration's generation (a fresh
    LoRA where it has none)."""
    if ctx.cfg.train.adapters == "shared":
        return [(None, rows, ctx.adapter, out)]
    roles = sorted({r.role for r in rows}, key=lambda role: (role != Role.SOLVER, list(Role).index(Role(role))))
    return [(role, [r for r in rows if r.role == role], ctx.adapter_for(Role(role)), role_adapter_dir(out, role))
            for role in roles]


def carry_untrained(ctx: RunContext, trained: set[str], out: Path) -> list[str]:
    """Under `train.adapters` per_role, a role `train.roles` lists that had no rows this iteration keeps the adapter
    it generated with: copied into the new checkpoint, so the next iteration generates with it. Returns them."""
    carried = []
    for role in ctx.cfg.train.roles:
        held = ctx.adapter_for(role)
        if ctx.cfg.train.adapters == "per_role" and str(role) not in trained and held is not None:
            shutil.copytree(held, role_adapter_dir(out, role), ignore=shutil.ignore_patterns(ROLES_DIR))
            carried.append(str(role))
    return carried


def run(ctx: RunContext) -> StageReport:
    from sage.engines.llm.models import resolve_model

    if not ctx.cfg.train.enabled:
        return StageReport(STAGE, info={"skipped": "train.enabled is false"})
    if checkpoint_path(ctx.wh, ctx.run_id, ctx.iteration):
        return StageReport(STAGE, info={"skipped": "checkpoint exists"})
    if ctx.cfg.train.accelerate_config:  # a misspelt name fails here, before any work
        launch.accelerate_config_path(ctx.cfg.train.accelerate_config)
    if ctx.cfg.train.report_to:  # and a tracker whose package is missing
        from transformers.integrations.integration_utils import get_available_reporting_integrations

        missing = sorted(set(ctx.cfg.train.report_to) - set(get_available_reporting_integrations()))
        if missing:
            raise RuntimeError(f"train.report_to names {', '.join(missing)}, whose package is not installed: install "
                               f"it (`pip install {missing[0]}`) or leave it out of train.report_to")
    rows = stored_rows(ctx.wh, ctx.cfg, ctx.run_id, ctx.iteration)
    if not rows:  # an adapter trained on nothing would be recorded as this iteration's
        raise RuntimeError(f"train: iteration {ctx.iteration} of run {ctx.run_id!r} has no scored rollouts of roles "
                           f"{', '.join(map(str, ctx.cfg.train.roles))}; run `sage stage score --run {ctx.run_id} "
                           f"--iteration {ctx.iteration}` first")
    out = adapter_dir(ctx)
    if out.exists():  # left by a run killed between saving and recording: train again
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model_path = str(resolve_model(ctx.cfg.model.name, ctx.cfg.model.cache_dir))
    clear_train_steps(ctx.wh, ctx.run_id, ctx.iteration)  # an interrupted attempt's steps: this one replaces them
    ctx.engines.suspend("llm")  # the generation model sleeps (vllm) or is released (hf): not held while training
    # one tracker run per SAGE run, each update at its global step across iterations and resumes (training_curve's)
    tracking_dir = str(project_dir(ctx.wh) / "tensorboard" / run_dirname(ctx.run_id))
    tracking = {"run_name": ctx.run_id, "logging_dir": tracking_dir,
                "step_offset": train_steps_before(ctx.wh, ctx.run_id, ctx.iteration)}
    writer, by_role, updates = _StepWriter(ctx), {}, 0
    for role, role_rows, adapter_in, adapter_out in passes(ctx, rows, out):
        if role is not None:  # each role's adapter its own tracker curve, at its own global step
            tracking = {"run_name": f"{ctx.run_id}-{role}", "logging_dir": f"{tracking_dir}-{role}",
                        "step_offset": train_steps_before(ctx.wh, ctx.run_id, ctx.iteration, role)}
        metrics = launch.train(model_path, adapter_in, str(adapter_out), role_rows, train_config(ctx.cfg),
                               seed=ctx.cfg.run.seed + ctx.iteration, dtype=ctx.cfg.model.dtype,
                               on_step=writer.next_pass(role, updates), tracking=tracking)
        # Per-update logs and the per-process row split stay in the adapter's metrics file, out of the warehouse.
        metrics.pop("steps", None)
        metrics.pop("rows_by_rank", None)
        updates += metrics.get("n_updates") or 0
        by_role[role] = metrics
    metrics = checkpoint_metrics(by_role, carry_untrained(ctx, {r for r in by_role if r}, out))
    record_checkpoint(ctx.wh, ctx.run_id, ctx.iteration, str(out), metrics)
    return StageReport(STAGE, rows_in=len(rows), rows_out=1,
                       info={k: metrics.get(k) for k in ("loss", "grad_norm", "tokens_per_s")})


def checkpoint_metrics(by_role: dict[str | None, dict], carried: list[str]) -> dict:
    """The checkpoint's metrics: the one pass's (`shared`); under per_role the Solver's pass's, with the rows,
    tokens, updates and seconds of every pass summed, `adv_mean_by_role` of them all, each pass's own metrics under
    `passes` and the roles whose adapter was carried unchanged under `carried`."""
    if list(by_role) == [None]:
        return by_role[None]
    metrics = dict(by_role[Role.SOLVER.value])
    for key in ("n_rows", "n_skipped", "tokens", "completion_tokens", "n_updates", "seconds", "cpu_seconds",
                "total_seconds", "old_logps_seconds"):
        metrics[key] = sum(m.get(key) or 0 for m in by_role.values())
    metrics["adv_mean_by_role"] = {k: v for m in by_role.values() for k, v in (m.get("adv_mean_by_role") or {}).items()}
    metrics["passes"] = {role: {k: m.get(k) for k in ("loss", "grad_norm", "n_rows", "n_updates", "tokens",
                                                      "total_seconds")} for role, m in by_role.items()}
    metrics["carried"] = carried
    return metrics


def retain(ctx: RunContext) -> dict[str, list[int]]:
    """Checkpoint retention after iteration `ctx.iteration` (`train.keep_last`; null keeps everything): delete the
    adapter directories and the optimizer states `checkpoints.retention_plan` names, then record the deletions.
    Files go before the rows say so: an interrupted call leaves at most a deletion unrecorded, which the next call
    finds again and records. Only paths inside the project directory are deleted (an absolute path an older
    version stored may be another project's). Returns the iterations whose adapter went and whose optimizer state
    alone went."""
    keep = ctx.cfg.train.keep_last
    if keep is None:
        return {"adapters": [], "optimizers": []}
    adapters, optimizers = retention_plan(ctx.wh, ctx.run_id, ctx.iteration, keep)
    adapters, optimizers = ([r for r in rows if not Path(r["adapter_path"]).is_absolute()]
                            for rows in (adapters, optimizers))
    project = project_dir(ctx.wh)
    for r in adapters:
        if (project / r["adapter_path"]).exists():
            shutil.rmtree(project / r["adapter_path"])
    for r in optimizers:  # the checkpoint's, and under per_role each role's beside it
        for state in [project / r["adapter_path"] / OPTIMIZER_FILE,
                      *(project / r["adapter_path"] / ROLES_DIR).glob(f"*/{OPTIMIZER_FILE}")]:
            state.unlink(missing_ok=True)
    pruned = {"adapters": [r["iteration"] for r in adapters], "optimizers": [r["iteration"] for r in optimizers]}
    if adapters or optimizers:
        record_pruned(ctx.wh, ctx.run_id, pruned["adapters"], pruned["optimizers"])
    return pruned
