"""How much of a training pass is prompt prefix shared by the rows of one optimizer update: the most that
computing each shared prefix once per update (instead of once per row) could save.

    .venv/bin/python -m bench.prefixes RUN_DIR [--iteration 1] [--set section.field=value]

RUN_DIR is a `sage run` project directory. The rows are the iteration's stored training rows in the order the
trainer's seeded sampler visits them (`run.seed + iteration`; `--set train.update_order=by_prompt` for whole
questions an update), cut into updates of `train.minibatch_size x
train.grad_accum` rows; a row's shared tokens are the longest prompt prefix it has in common with an earlier
row of its update. Prints the prompt share of all tokens, the shared share within updates, and the share if the
whole iteration were one update, and what `train.share_prefix` (one prefix run per group of an update's rows,
`engines/train/prefix.py`) does not recompute. Never run as a test.
"""

from __future__ import annotations

import argparse

from sage.engines.train.prefix import SharedPrefixes, common_prefix


def shared_tokens(prompts: list[list[int]]) -> int:
    """Tokens of each prompt already in an earlier prompt's prefix, summed."""
    return sum(max((common_prefix(p, q) for q in prompts[:i]), default=0) for i, p in enumerate(prompts))


def saved_tokens(prompts: list[list[int]]) -> int:
    """Prompt tokens `train.share_prefix` does not recompute in one update of these prompts."""
    shared = SharedPrefixes(prompts)
    return sum(len(prefix) * (n - 1) for prefix, n in shared.rows_expected.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--iteration", type=int, default=1)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()

    from sage.configs import load_config
    from sage.engines.train.rows import block_sampler_class, prompt_groups
    from sage.stages.train import stored_rows
    from sage.warehouse import Warehouse

    cfg = load_config("cpu", args.overrides)
    wh = Warehouse(f"{args.run_dir}/warehouse.duckdb", read_only=True)
    run_id = wh.rows("SELECT run_id FROM runs ORDER BY created_at LIMIT 1")[0]["run_id"]
    rows = [r for r in stored_rows(wh, cfg, run_id, args.iteration) if r.completion_ids]
    block = cfg.train.minibatch_size * cfg.train.grad_accum
    # the trainer's own sampler, seeded as the train stage seeds it; -1 fills a short last block
    order = list(block_sampler_class()(n_rows=len(rows), block=block, repeats=1, dummy=-1, shuffle=True,
                                       seed=cfg.run.seed + args.iteration,
                                       groups=prompt_groups(rows) if cfg.train.update_order == "by_prompt" else None))
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    prompt = sum(len(r.prompt_ids) for r in rows)
    within = sum(shared_tokens([rows[i].prompt_ids for i in order[s:s + block] if i >= 0])
                 for s in range(0, len(order), block))
    whole = shared_tokens([r.prompt_ids for r in rows])
    saved = sum(saved_tokens([rows[i].prompt_ids for i in order[s:s + block] if i >= 0])
                for s in range(0, len(order), block))
    print(f"iteration {args.iteration}: {len(rows)} rows, {tokens} tokens, {prompt / tokens:.1%} of them prompt; "
          f"shared prompt prefix within {block}-row updates {within} tokens ({within / tokens:.1%}); "
          f"if the iteration were one update {whole / tokens:.1%}; not recomputed by train.share_prefix "
          f"{saved} ({saved / tokens:.1%})")


if __name__ == "__main__":
    main()
