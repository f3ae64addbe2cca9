"""The heavy machinery, one sub-package per concept, each behind a small interface; nothing here knows
about DuckDB or Prefect.

- `llm/`: generation backends (transformers, vLLM) and model resolution.
- `verify/`: the external verifiers: the code sandbox (its OS isolation layer and its child), comparison of
  what sandboxed code returned with what was expected, and the math checker (equivalence of two answers).
- `train/`: the policy-gradient step on stored rows (a TRL `GRPOTrainer` subclass) and adapter merging.
- `text/`: what model output means: role tag parsing, the constrained-output regexes, code and answer extraction,
  a math question's arithmetic.
- `data/`: problems from outside: seeds, benchmarks (and how their code checks run), HumanEval.
"""

# This folder is the package `sage.engines` (`sage/engines` links here); imported as a bare `engines` it would be a
# second copy of every module, with its own enums and state.
if __name__ != "sage.engines":
    raise ImportError(f"import sage.engines, not {__name__}: this folder is the package sage.engines")
