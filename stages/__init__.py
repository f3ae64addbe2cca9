"""The stages: one module per verb (seed, challenge, critique, plan, solve, verify, score, admit, train,
validate, evaluate), each a plain function `run(ctx) -> StageReport` that reads its inputs from the warehouse,
works through engines/, and writes its outputs back. Prompt templates live in `prompts/`; the reward formulas
and TRR++ are pure functions in `score.py`."""
# pyright: basic

# This folder is the package `sage.stages` (`sage/stages` links here); imported as a bare `stages` it would be a second
# copy of every module, with its own enums and state.
if __name__ != "sage.stages":
    raise ImportError(f"import sage.stages, not {__name__}: this folder is the package sage.stages")
