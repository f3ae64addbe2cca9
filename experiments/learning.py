"""Does the loop teach the model? N SAGE iterations of one config through the real flow, measured per iteration.

    .venv/bin/python -m experiments.learning [--iterations 10] [--config cpu] [--model tiny] [--set section.field=value]
        [--out DIR] [--run ID] [--kl-sequences 40] [--extremes 8] [--format-prompts 8]

A validation accuracy that barely moves says nothing about why, so beside it this measures, for iteration
k = 0 (the base model) .. N, where the learning signal goes and how far the policy moved:

- validation pass@1 (greedy, the `validate` stage's own verdicts) on the config's held-out set when it has at
  least 100 problems (`cpu.yaml`: 300 math), else on 50 math + 50 code, the same problems every iteration,
  with a 95% Wilson interval and an exact McNemar test against the base model on the problems whose outcome
  changed (b: base right, now wrong; c: the reverse);
- per role, from `scores`: rollouts, the share with a non-zero TRR++ advantage, mean |advantage|, reward mean
  and std; under grammar annealing (`roles.<role>.unconstrained`) how many training samples were drawn
  without the grammar and the share of them well formed; the Challenger's admission rate and rejections by
  reason (`questions`); the plan gate's pass rate;
- how far the policy moved (`experiments/learning_model.py`): mean per-token KL(adapter k || base) over the base
  model's own validation answers (full vocabulary, float32), and the mean per-token log-prob change, from the
  policy that sampled them to adapter k, of iteration k's rollouts with the highest and the lowest advantages;
- per role, the share of outputs that are well formed (format reward r_f = 1) when sampled WITHOUT the output
  grammar, on fixed seed-pool prompts with fixed seeds: whether the model learned the tags the grammar imposes.

The run lives in the output folder (its own warehouse, so the validation set is exactly the one configured),
default `sage-runs/learning/<run id>`. Rerunning the same command continues the run (same run id) and computes
only the measures missing from `measures.json` (each is deterministic given the seed). Writes `learning.csv`
(one row per iteration), `learning.md` (the command, config, seed, time, and the table with one column per
iteration) and PNG curves. `--model tiny` runs it on the tiny random test model in a few minutes.
`experiments/heldout.py` then tests the checkpoints on fresh problems: validation chose the kept one, so its
validation score is biased upwards. So that it can test every one (`--all`), the study keeps every adapter on disk
(`train.keep_last=null`, no checkpoint retention).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shlex
import sys
import time
from pathlib import Path

from experiments.learning_report import ROLES, Cache, cell, write_outputs

Z95 = 1.959963984540054


# -- statistics ----------------------------------------------------------------------------------------------
def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion k / n (95% by default)."""
    if n == 0:
        return 0.0, 1.0
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: a binomial test of b against Binomial(b + c, 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n)


# -- measures from the warehouse -----------------------------------------------------------------------------
def outcomes(wh, run_id: str, k: int) -> dict[str, tuple[str, bool]]:
    """Each validation problem of iteration k (0: the base model): its domain and whether it passed."""
    rows = wh.rows("""SELECT r.question_id, q.domain, v.s_gt >= 1.0 AS passed FROM rollouts r JOIN verdicts v
                      USING (rollout_id) JOIN questions q ON q.question_id = r.question_id
                      WHERE r.run_id = ? AND r.iteration = ? AND r.purpose = 'validate'""", [run_id, k])
    return {r["question_id"]: (r["domain"], bool(r["passed"])) for r in rows}


def validation(wh, run_id: str, k: int) -> dict:
    now, base = outcomes(wh, run_id, k), outcomes(wh, run_id, 0)
    passed = sum(p for _, p in now.values())
    lo, hi = wilson(passed, len(now))
    paired = [q for q in now if q in base]
    b = sum(base[q][1] and not now[q][1] for q in paired)
    c = sum(now[q][1] and not base[q][1] for q in paired)
    by_domain = {d: [p for dom, p in now.values() if dom == d] for d in ("math", "code")}
    return {"val_n": len(now), "val_pass1": passed / len(now) if now else None, "val_ci_lo": lo, "val_ci_hi": hi,
            **{f"val_{d}": sum(v) / len(v) if v else None for d, v in by_domain.items()},
            "mcnemar_b": b, "mcnemar_c": c, "mcnemar_p": mcnemar_exact(b, c)}


def signal(wh, run_id: str, k: int) -> dict:
    from sage.configs.names import TRAINED_PURPOSES
    from sage.flows.report import REJECTION_REASONS
    from sage.stages.admit import LABEL_FAILURES

    roles = {r["role"]: r for r in wh.rows("""
        WITH cur AS (SELECT * FROM scores WHERE run_id = ? AND iteration = ?
                     QUALIFY reward_version = max(reward_version) OVER ())
        SELECT role, count(*) AS n, avg(CASE WHEN abs(advantage) > 1e-9 THEN 1.0 ELSE 0.0 END) AS nonzero,
               avg(abs(advantage)) AS abs_adv, avg(reward) AS reward, stddev_pop(reward) AS reward_std
        FROM cur GROUP BY role""", [run_id, k])}
    # grammar annealing: the training samples drawn without the grammar, and how many of them are well formed
    free = {r["role"]: r for r in wh.rows("""
        SELECT role, count(*) AS n, avg(format_reward) AS format FROM rollouts
        WHERE run_id = ? AND iteration = ? AND constrained = false AND list_contains(?::VARCHAR[], purpose)
        GROUP BY role""", [run_id, k, sorted(map(str, TRAINED_PURPOSES))])}
    out = {}
    for role in ROLES:
        r, f = roles.get(role, {}), free.get(role, {})
        out.update({f"{role}_rollouts": r.get("n", 0), f"{role}_nonzero_adv": r.get("nonzero"),
                    f"{role}_mean_abs_adv": r.get("abs_adv"), f"{role}_reward_mean": r.get("reward"),
                    f"{role}_reward_std": r.get("reward_std"), f"{role}_annealed": f.get("n", 0),
                    f"{role}_annealed_format": f.get("format")})
    reasons = {r["reason"]: r["n"] for r in wh.rows("""
        SELECT coalesce(rejection_reason, CASE WHEN admitted THEN 'admitted' ELSE 'undecided' END) AS reason,
               count(*) AS n FROM questions WHERE origin = 'generated' AND run_id = ? AND iteration = ?
        GROUP BY ALL""", [run_id, k])}
    reasons["ungrounded"] = sum(reasons.get(r, 0) for r in LABEL_FAILURES)
    generated = sum(reasons.values()) - reasons["ungrounded"]
    audit = wh.rows("""SELECT count(*) FILTER (WHERE label_check = 'grounded') AS grounded,
                              avg(copy_of_batch::INT) AS copy_share
                       FROM curriculum_audit WHERE run_id = ? AND iteration = ?""", [run_id, k])[0]
    out.update({"generated": generated, "admitted": reasons.get("admitted", 0),
                "admission_rate": reasons.get("admitted", 0) / generated if generated else None,
                "grounded": audit["grounded"] or 0, "copy_share": audit["copy_share"],
                **{f"rej_{r}": reasons.get(r, 0) for r in (*REJECTION_REASONS, *sorted(LABEL_FAILURES))}})
    plans = wh.rows("SELECT count(*) AS n, avg(passed::INT) AS rate FROM plans WHERE run_id = ? AND iteration = ?",
                    [run_id, k])[0]
    out.update({"plans": plans["n"], "plan_pass_rate": plans["rate"]})
    # the Solver's training answers shown a plan and not: how many, and how often right (the `solver_hints` view)
    hints = {r["plan_shown"]: r for r in wh.rows("SELECT plan_shown, answers, pass_rate FROM solver_hints "
                                                 "WHERE run_id = ? AND iteration = ?", [run_id, k])}
    for shown, name in ((True, "solver_shown_plan"), (False, "solver_plain")):
        out.update({f"{name}": hints.get(shown, {}).get("answers", 0),
                    f"{name}_pass_rate": hints.get(shown, {}).get("pass_rate")})
    return out


def timing(wh, run_id: str, k: int) -> dict:
    stages = {r["stage"]: r["seconds"] or 0.0 for r in
              wh.rows("SELECT stage, seconds FROM stage_runs WHERE run_id = ? AND iteration = ?", [run_id, k])}
    return {"sage_seconds": sum(v for s, v in stages.items() if s != "validate"),
            "validate_seconds": stages.get("validate", 0.0)}


def kl_sequences(wh, run_id: str, limit: int) -> list[dict]:
    """The base model's own validation prompts + answers (iteration 0), half math, half code, in id order."""
    rows = wh.rows("""SELECT r.rollout_id, q.domain, r.prompt_ids, r.completion_ids FROM rollouts r
                      JOIN questions q ON q.question_id = r.question_id
                      WHERE r.run_id = ? AND r.iteration = 0 AND r.purpose = 'validate' ORDER BY r.rollout_id""",
                   [run_id])
    math_, code = [r for r in rows if r["domain"] == "math"], [r for r in rows if r["domain"] == "code"]
    n_code = min(len(code), limit - min(len(math_), limit // 2))
    return math_[:limit - n_code] + code[:n_code]


def extremes(wh, run_id: str, k: int, n: int) -> list[dict]:
    """Iteration k's `n` trained rollouts with the highest positive and the `n` with the lowest negative advantage,
    each with the adapter that sampled it where it is now (stored relative to the project)."""
    from sage.stages.score import REWARD_VERSION
    from sage.warehouse.queries import located_path

    rows = wh.rows("""SELECT r.rollout_id, r.role, r.prompt_ids, r.completion_ids, r.logprobs, r.adapter, s.advantage
                      FROM scores s JOIN rollouts r USING (rollout_id)
                      WHERE s.run_id = ? AND s.iteration = ? AND s.reward_version = ?
                      ORDER BY s.advantage DESC, r.rollout_id""", [run_id, k, REWARD_VERSION])
    rows = [dict(r, adapter=located_path(wh, r["adapter"])) for r in rows]
    top = [dict(r, group="top") for r in rows if r["advantage"] > 0][:n]
    bottom = [dict(r, group="bottom") for r in reversed(rows) if r["advantage"] < 0][:n]
    return top + bottom


def seed_questions(wh, seed: int) -> dict[str, list[dict]]:
    """Every seed question per domain, in a random order fixed by `seed`."""
    from sage.warehouse.queries import questions_by_id

    ids = [r["question_id"] for r in wh.rows("SELECT question_id FROM questions WHERE origin = 'seed' "
                                             "ORDER BY md5(? || question_id), question_id", [f"learning-{seed}"])]
    by_id = questions_by_id(wh, ids)
    return {d: [by_id[i] for i in ids if by_id[i]["domain"] == d] for d in ("math", "code")}


# -- the run ---------------------------------------------------------------------------------------------------
def build_config(args) -> tuple[object, Path]:
    """The config (with the study's validation settings, and every checkpoint kept on disk) and the output folder,
    which is also the run's dir."""
    from sage.configs import config_hash, load_config
    from sage.engines.llm.tiny import TINY_RUN, build_tiny_model

    root = Path(args.out) if args.out else Path("sage-runs/learning")
    # Every adapter stays (no checkpoint retention): `experiments.heldout --all` scores each one after the run.
    overrides = ["validate.every=1", f"validate.patience={args.iterations + 1}", "train.keep_last=null"]
    given = load_config(args.config, args.overrides).validate
    if given.n_math + given.n_code < 100:  # the config's own set when it has 100 problems (cpu.yaml: 300 math)
        overrides = ["validate.n_math=50", "validate.n_code=50"] + overrides
    if args.model == "tiny":
        overrides += TINY_RUN + [f"model.name={build_tiny_model(root / 'tiny-model').resolve()}",
                                 f"model.cache_dir={(root / 'models').resolve()}"]
    cfg = load_config(args.config, overrides + args.overrides)
    out = root if args.out else root / f"run-{config_hash(cfg)[:8]}"
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"dir": str(out.resolve())})})
    return cfg, out


def measure(s, cache: Cache, args, run_id: str, k: int, state: dict) -> None:
    """Compute what `cache` lacks for iteration k, printing one line per measure computed."""
    from experiments import learning_model as lm
    from sage.engines.llm.models import resolve_model
    from sage.stages.train import sampling_temperature
    from sage.warehouse.queries import iteration_adapter

    wh, cfg = s.warehouse, s.run_config(run_id)
    adapter = iteration_adapter(wh, run_id, k) if k else None

    def scorer():
        if "scorer" not in state:
            state["scorer"] = lm.Scorer(resolve_model(cfg.model.name, cfg.model.cache_dir))
        return state["scorer"]

    def kl():
        scorer().use(adapter)
        return scorer().kl_to_base(kl_sequences(wh, run_id, args.kl_sequences))

    def logprob():
        return lm.logprob_change(scorer(), extremes(wh, run_id, k, args.extremes), adapter,
                                 lambda role: sampling_temperature(cfg, role))

    def format_():
        units = lm.format_units(seed_questions(wh, cfg.run.seed), args.format_prompts)
        return lm.format_rates(s.context(run_id, k), units, adapter, cfg.run.seed)

    todo = [("validation", {}, lambda: validation(wh, run_id, k)), ("timing", {}, lambda: timing(wh, run_id, k)),
            ("format", {"per_kind": args.format_prompts}, format_)]
    if k > 0:
        todo += [("signal", {}, lambda: signal(wh, run_id, k)), ("kl", {"sequences": args.kl_sequences}, kl),
                 ("logprob", {"extremes": args.extremes}, logprob)]
    elif cache.get(0, "kl", {}) is None:
        cache.put(0, "kl", {}, {"kl_mean": 0.0}, 0.0)  # the base model against itself
    for name, params, fn in todo:
        if cache.get(k, name, params) is None:
            start = time.perf_counter()
            value = fn()
            cache.put(k, name, params, value, time.perf_counter() - start)
            shown = {key: cell(v) for key, v in value.items() if not key.endswith(("_n", "_tokens"))}
            print(f"[learning] iteration {k} {name} ({time.perf_counter() - start:.1f} s): "
                  + ", ".join(f"{key} {v}" for key, v in list(shown.items())[:8]), flush=True)


def checkpoints(iterations: int, every: int) -> list[int]:
    """The iterations a run of `iterations` validates (0 = the base model), as `sage run` schedules them."""
    from sage.flows.evolve import validates_after

    return [0] + [k for k in range(1, iterations + 1) if validates_after(k, every, iterations)]


def run(args, cfg, out: Path, header, spent) -> int:
    """`sage run` up to each validated iteration k in turn (resuming the run), measuring k right after it: the
    flow itself seeds, trains, validates and stops early, so the real flow decides everything. Each call is a
    `sage-run` flow run that skips what is done (a rerun of the same command redoes nothing); k is measured while
    its adapter is the newest (the study keeps every adapter anyway: `build_config`)."""
    from sage.flows.api_server import prefect_api
    from sage.flows.evolve import evolve_flow
    from sage.flows.progress import LINES, Display
    from sage.flows.record import ended, stopped_by_signals
    from sage.flows.session import Session
    from sage.flows.terminal import err, quiet_prefect_tracebacks
    from sage.warehouse.validate_queries import validation_history

    directory = str(out.resolve())
    with Session(directory) as first:
        run_id = first.create_run(cfg, args.run)
    cache, state, last = Cache(out / "measures.json", run_id), {}, -1
    print(f"[learning] run {run_id}: {args.iterations} iteration(s) in {out}", flush=True)
    with stopped_by_signals():  # as `sage run`: Ctrl-C or SIGTERM stops within seconds, resumable
        try:
            with prefect_api(), Display(err, LINES, run_id=run_id, iterations=args.iterations) as shown, \
                    Session(directory, display=shown) as s:
                quiet_prefect_tracebacks()
                for k in checkpoints(args.iterations, cfg.validate.every):
                    evolve_flow(directory, run_id, k)
                    last = max((r["iteration"] for r in validation_history(s.warehouse, run_id)), default=-1)
                    if last < k:  # stopped early (validate.patience), or no validation questions
                        break
                    measure(s, cache, args, run_id, k, state)
                    write_outputs(out, cache, header)
        except BaseException as e:
            if ended(e) != "interrupted":
                raise
            cache.log(dict(spent(), interrupted=True))  # its time counts towards the run's, like a finished one's
            print("[learning] interrupted: what was measured is kept; rerun the same command to continue",
                  flush=True)
            raise SystemExit(130) from None
    if last < args.iterations:
        print(f"[learning] the run stopped early after iteration {last} (validate.patience): measured 0..{last}")
    return last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", "-n", type=int, default=10)
    ap.add_argument("--config", "-c", default="cpu", help="profile name or YAML path (default cpu)")
    ap.add_argument("--model", choices=["config", "tiny"], default="config",
                    help="tiny: the tiny random test model with small sizes (smoke test)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="section.field=value")
    ap.add_argument("--out", default=None, help="output folder and run dir (default sage-runs/learning/<run id>)")
    ap.add_argument("--run", default=None, help="run id (default run-<config hash>). Every sample a run draws is "
                    "seeded by its id, so a config change also changes which questions are drawn; give the changed "
                    "config the id of the run it is compared with to draw the same ones, and only the change differs")
    ap.add_argument("--kl-sequences", type=int, default=40)
    ap.add_argument("--extremes", type=int, default=8, help="top and bottom rollouts by advantage")
    ap.add_argument("--format-prompts", type=int, default=8, help="unconstrained prompts per prompt kind")
    args = ap.parse_args()
    start = time.perf_counter()
    cfg, out = build_config(args)
    out.mkdir(parents=True, exist_ok=True)

    def spent() -> dict:
        cpu = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                  for f in ("ru_utime", "ru_stime"))
        return {"command": shlex.join(sys.argv[1:]), "wall_s": round(time.perf_counter() - start, 1),
                "cpu_s": round(cpu, 1)}

    def header(cache: Cache) -> list[str]:
        v, now = cfg.validate, spent()
        runs = cache.data.get("invocations", []) + [now]
        return [f"# Does the loop teach the model? ({cfg.model.name})", "",
                f"- command: `.venv/bin/python -m experiments.learning {now['command']}`",
                f"- config: {args.config}, --model {args.model}, {' '.join(args.overrides) or 'no --set'}; validation "
                f"{v.n_math} math + {v.n_code} code, every {v.every}, patience {v.patience}; seed {cfg.run.seed}; "
                f"N = {args.iterations}",
                f"- time: wall {sum(r['wall_s'] for r in runs):.0f} s, CPU {sum(r['cpu_s'] for r in runs):.0f} s "
                f"(process + children) over {len(runs)} invocation(s), this one wall {now['wall_s']:.0f} s, CPU "
                f"{now['cpu_s']:.0f} s; each iteration's seconds are in the table (`*_seconds`)"]

    done = run(args, cfg, out, header, spent)
    cache = Cache(out / "measures.json", json.loads((out / "measures.json").read_text())["run_id"])
    write_outputs(out, cache, header)  # again, now that the children's CPU time is counted
    cache.log(spent())
    print(f"[learning] iterations 0..{done}: {out / 'learning.md'}")
    print((out / "learning.md").read_text())


if __name__ == "__main__":
    main()
