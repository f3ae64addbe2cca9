"""Prompt quality for a config: greedy Solver pass@1 on the validation set per domain, and per role the
format rate, mean completion tokens, how often the output hits the token limit, and how often it copies the
prompt's worked example.

    .venv/bin/python -m experiments.prompts [--profile cpu] [--dir RUN_DIR] [--roles solver,challenger,planner,critic]
        [--n-roles 12] [--origin validation|seed] [--per-domain N] [--regex-tokens N] [--set section.field=value]
        [--dump generations.jsonl] [--baseline GIT_REV]

Requests are built as the stages build them: `sage.stages.prompts.render` of the config's prompt set
(`roles.prompts`, so `--profile paper-7b` measures the reasoning prompts), each role's `max_new_tokens`,
temperature and top_p, and its regex from `engines/text/grammar.py` when the role has `constrain: true`
(validation: greedy with `validate.max_new_tokens`, as the validate stage does). Scoring is the verify
stage's own `verdicts` (math-verify, the sandbox). Validation problems come from the warehouse in `--dir`
(read-only) when it has them, else the seed stage loads them into a temporary warehouse. Challenger, Planner and
Critic are sampled on the first `--n-roles` validation problems (half math, half code), seeded, so two
prompt versions see the same references. `measure(..., render=f)` lets an experiment pass another prompt
renderer (called as `f(kind, prompt_set=..., **fields)`); `--baseline REV` also measures the prompts of
`stages/prompts` at git revision REV, side by side with the current ones, on the same problems and seeds (a
revision from before prompt sets only with `roles.prompts=short`). "copied ex." counts outputs that share a
5-word run with the worked example (not with the task), or box the example's answer. Prints one table; never
run as a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sage.configs import load_config
from sage.engines.llm.base import GenRequest
from sage.engines.text import tags
from sage.engines.text.answers import last_boxed
from sage.stages.prompts import render as current_render
from sage.stages.prompts import version
from sage.stages.rollouts import question_fields as solver_fields

Render = Callable[..., list[dict]]
GROUPS = ("solver math", "solver code", "challenger math", "challenger code", "planner", "critic")
COPY_NGRAM = 5          # words; a shared 5-gram ("7 boxes of 12 pens") is copying, not chance


def validation_problems(cfg, run_dir: str | None, origin: str = "validation",
                        per_domain: int | None = None) -> list[dict]:
    """question_id, domain, text, verifier (JSON text) of every question of `origin` (at most `per_domain`
    of each domain), in a stable order. Seed problems give a larger sample than the 20 + 20 validation set.
    When the warehouse in `run_dir` (or the config's run dir) has none, the seed stage itself loads them into a
    temporary one, as `sage seed` would (code outputs from the reference solutions, sandboxed)."""
    import tempfile

    from sage.warehouse import Warehouse

    path = Path(run_dir or cfg.run.dir) / "warehouse.duckdb"
    rows = _questions(path, origin, per_domain) if path.exists() else []
    if rows:
        return rows
    if origin not in ("validation", "seed"):
        raise SystemExit(f"no {origin!r} questions in {path}")
    from sage.stages import seed
    from sage.stages.context import StageContext

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "warehouse.duckdb"
        with Warehouse.open(path) as wh:
            ctx = StageContext(cfg=cfg, wh=wh)
            try:
                seed.run(ctx)
            finally:
                ctx.close()
        return _questions(path, origin, per_domain)


def _questions(path: Path, origin: str, per_domain: int | None) -> list[dict]:
    from sage.warehouse import Warehouse

    with Warehouse.open(path, read_only=True, migrate=False) as wh:
        rows = wh.rows("SELECT question_id, domain, text, verifier FROM questions WHERE origin = ? "
                       "ORDER BY question_id", [origin])
    return [r for d in ("math", "code") for r in [r for r in rows if r["domain"] == d][:per_domain]]


def _words(text: str) -> list[str]:
    text = re.sub(r"</?(" + "|".join(tags.TAG_NAMES) + r")>", " ", text, flags=re.I)
    return re.findall(r"\w+", text.lower())


def _ngrams(words: list[str], n: int = COPY_NGRAM) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


_INLINE_EXAMPLE = re.compile(r"\nExample[^\n]*:\n")


def split_example(messages: list[dict]) -> tuple[str, str]:
    """(every worked example the prompt shows, the task alone): examples are the turns between the system
    prompt and the last user turn (few-shot) plus an inline 'Example...:' tail of the last user turn."""
    parts = [m["content"] for m in messages[:-1] if m["role"] != "system"]
    task = messages[-1]["content"]
    m = _INLINE_EXAMPLE.search(task)
    if m:
        parts.append(task[m.end():])
        task = task[:m.start()]
    return "\n".join(parts), task


def copies(completion: str, example: str, task: str) -> bool:
    """The completion shares a word 5-gram with the example that the task itself does not contain, or its
    final \\boxed{} answer is one of the example's and appears nowhere in the task (a copied number)."""
    if (_ngrams(_words(completion)) & _ngrams(_words(example))) - _ngrams(_words(task)):
        return True
    boxed = last_boxed(completion)
    return bool(boxed) and boxed in example and boxed[7:-1].strip() not in _words(task)


def _request(cfg, role: str, domain: str, messages: list[dict], seed: int, greedy: bool,
             regex_tokens: int | None = None) -> GenRequest:
    role_cfg = getattr(cfg.roles, role)
    max_new = cfg.validate.answer_tokens(cfg.roles.solver) if greedy else role_cfg.max_new_tokens
    regex = None
    if role_cfg.constrain:   # `regex_tokens` sizes the Solver's bounds for a smaller budget than it may use
        key = tags.role_key(role, domain if role in ("challenger", "solver") else None)
        regex = tags.role_regex(key, regex_tokens if regex_tokens and role == "solver" else max_new)
    return GenRequest(messages=messages, n=1, max_new_tokens=max_new, temperature=0.0 if greedy else
                      role_cfg.temperature, top_p=1.0 if greedy else role_cfg.top_p, seed=seed, regex=regex)


def _units(cfg, problems: list[dict], roles: list[str], n_roles: int, render: Render) -> list[dict]:
    """One unit per request: role, domain, kind, messages, the problem, and whether it is greedy validation.
    Prompts come from the config's prompt set (`roles.prompts`), as the stages render them."""
    prompt_set = cfg.roles.prompts
    units = []
    if "solver" in roles:
        for p in problems:
            kind = f"solver_{p['domain']}"
            units.append(dict(role="solver", domain=p["domain"], kind=kind, problem=p, greedy=True,
                              messages=render(kind, prompt_set=prompt_set, **solver_fields(p))))
    by_domain = {d: [p for p in problems if p["domain"] == d] for d in ("math", "code")}
    refs = by_domain["math"][:n_roles // 2] + by_domain["code"][:n_roles - n_roles // 2]
    for p in refs:
        fields = solver_fields(p)
        if "challenger" in roles:
            kind = f"challenger_{p['domain']}"
            units.append(dict(role="challenger", domain=p["domain"], kind=kind, problem=p, greedy=False,
                              messages=render(kind, prompt_set=prompt_set, **fields)))
        if "planner" in roles:
            units.append(dict(role="planner", domain=p["domain"], kind="planner", problem=p, greedy=False,
                              messages=render("planner", prompt_set=prompt_set, **fields)))
        if "critic" in roles:
            units.append(dict(role="critic", domain=p["domain"], kind="critic_question", problem=p, greedy=False,
                              messages=render("critic_question", prompt_set=prompt_set, **fields)))
    return units


def _s_gt(units: list[dict], parsed: list[tags.Parsed], checker, sandbox) -> list[float | None]:
    """s_gt of every greedy (validation) Solver answer, by the verify stage's own `verdicts`; None elsewhere."""
    from types import SimpleNamespace

    from sage.stages.verify import verdicts

    rows = [dict(rollout_id=i, domain=u["domain"], parsed=parsed[i].fields,
                 verifier=u["problem"]["verifier"]) for i, u in enumerate(units) if u["greedy"]]
    out: list[float | None] = [None] * len(units)
    for v in verdicts(SimpleNamespace(mathcheck=checker, sandbox=sandbox), rows) if rows else []:
        out[v["rollout_id"]] = v["s_gt"]
    return out


def measure(llm, cfg, problems: list[dict], render: Render = current_render, roles: list[str] | None = None,
            n_roles: int = 12, checker=None, sandbox=None, regex_tokens: int | None = None) -> tuple[dict, list[dict]]:
    """(summary numbers, one record per generation) for one prompt renderer."""
    roles = roles or ["solver", "challenger", "planner", "critic"]
    units = _units(cfg, problems, roles, n_roles, render)
    requests = [_request(cfg, u["role"], u["domain"], u["messages"], 1000 + i, u["greedy"], regex_tokens)
                for i, u in enumerate(units)]
    start = time.perf_counter()
    results = llm.generate(requests)
    seconds = time.perf_counter() - start
    from sage.stages.rollouts import parse

    comps = [r.completions[0] for r in results]
    parsed = [parse(u["role"], u["domain"], c.text) for u, c in zip(units, comps)]
    scores = _s_gt(units, parsed, checker, sandbox)
    records = []
    for u, c, p, s in zip(units, comps, parsed, scores):
        copied = copies(c.text, *split_example(u["messages"]))
        records.append(dict(role=u["role"], domain=u["domain"], kind=u["kind"], text=c.text, tokens=len(c.token_ids),
                            finish=c.finish_reason, format=p.format_reward, reason=p.reason, s_gt=s,
                            copied=copied, answer=p.fields.get("answer") if u["role"] == "solver" else None,
                            fields=p.fields))
    return summarise(records, seconds), records


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def summarise(records: list[dict], seconds: float = 0.0) -> dict:
    out: dict = {"seconds": round(seconds, 1)}
    for d in ("math", "code"):
        out[f"{d}_acc"] = _mean(r["s_gt"] for r in records if r["role"] == "solver" and r["domain"] == d)
    for role in GROUPS:
        rs = [r for r in records if (r["role"] + " " + r["domain"]).startswith(role)]
        if rs:
            out[role] = dict(n=len(rs), format=_mean(r["format"] == 1.0 for r in rs),
                             tokens=_mean(r["tokens"] for r in rs), at_limit=sum(r["finish"] == "length" for r in rs),
                             copied=sum(r["copied"] for r in rs))
    return out


def _fmt(x, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.0f}%" if pct else f"{x:.0f}"


def table(rows: list[tuple[str, dict]]) -> str:
    head = ["variant", "math acc", "code acc", "role", "format", "mean tok", "at limit", "copied ex."]
    lines = [head]
    for name, s in rows:
        first = True
        for role in GROUPS:
            if role not in s:
                continue
            r = s[role]
            lines.append([name if first else "", _fmt(s["math_acc"], True) if first else "",
                          _fmt(s["code_acc"], True) if first else "", role, _fmt(r["format"], True),
                          _fmt(r["tokens"]), f"{r['at_limit']}/{r['n']}", f"{r['copied']}/{r['n']}"])
            first = False
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in lines)


def baseline_render(rev: str) -> Render:
    """`render` of `stages/prompts/__init__.py` as it was at git revision `rev`, loaded as a separate module."""
    import importlib.util
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(["git", "show", f"{rev}:stages/prompts/__init__.py"], cwd=root, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"--baseline {rev}: {proc.stderr.strip()} (give a commit, tag or branch of this repo)")
    path = Path(tempfile.mkdtemp()) / "baseline_prompts.py"
    path.write_text(proc.stdout)
    spec = importlib.util.spec_from_file_location("baseline_prompts", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    import inspect

    if "prompt_set" in inspect.signature(module.render).parameters:
        return module.render

    def short_only(kind: str, prompt_set: str = "short", **fields) -> list[dict]:
        """A revision from before prompt sets (`roles.prompts`) has only the short prompts."""
        if prompt_set != "short":
            raise SystemExit(f"--baseline {rev}: that revision has no prompt set {prompt_set!r} (roles.prompts), "
                             f"only the short prompts; measure it with roles.prompts=short")
        return module.render(kind, **fields)

    return short_only


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--dir", default=None, help="run directory whose warehouse holds the validation set")
    ap.add_argument("--roles", default="solver,challenger,planner,critic")
    ap.add_argument("--n-roles", type=int, default=12, help="references for Challenger, Planner and Critic")
    ap.add_argument("--origin", default="validation", help="question origin to measure on (validation, seed)")
    ap.add_argument("--per-domain", type=int, default=None, help="at most this many questions per domain")
    ap.add_argument("--set", action="append", default=[], help="config override section.field=value")
    ap.add_argument("--dump", default=None, help="write every generation as JSONL here")
    ap.add_argument("--regex-tokens", type=int, default=None,
                    help="size the Solver's constrained bounds for this many tokens (default: its max_new_tokens)")
    ap.add_argument("--baseline", default=None, help="also measure the prompts at this git revision, side by side")
    args = ap.parse_args()
    baseline = baseline_render(args.baseline) if args.baseline else None

    from sage.engines.llm import load_llm
    from sage.engines.verify.mathcheck import MathChecker
    from sage.engines.verify.sandbox import Sandbox

    cfg = load_config(args.profile, args.set)
    problems = validation_problems(cfg, args.dir, args.origin, args.per_domain)
    llm = load_llm(cfg.model)
    rows = []
    with MathChecker(cfg.mathcheck) as checker:
        kw = dict(roles=args.roles.split(","), n_roles=args.n_roles, checker=checker, sandbox=Sandbox(cfg.sandbox),
                  regex_tokens=args.regex_tokens)
        if baseline is not None:
            rows.append((args.baseline, measure(llm, cfg, problems, render=baseline, **kw)[0]))
        summary, records = measure(llm, cfg, problems, **kw)
        rows.append(("current", summary))
    if args.dump:
        with open(args.dump, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    versions = sorted({version(u["kind"], cfg.roles.prompts) for u in records})
    print(f"model {cfg.model.name}, profile {args.profile}, prompts {cfg.roles.prompts}, {len(problems)} "
          f"{args.origin} problems, templates {', '.join(versions)}, {summary['seconds']} s generating")
    print(table(rows))


if __name__ == "__main__":
    main()
