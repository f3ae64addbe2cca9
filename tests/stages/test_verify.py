"""verify: verdicts from rows as the warehouse hands them (JSON columns decoded), bad rows included."""

from __future__ import annotations

from types import SimpleNamespace

from sage.engines.verify.mathcheck import MathChecker
from sage.stages.verify import verdicts


def test_math_verdicts_from_decoded_rows_and_empty_ones():
    rows = [dict(rollout_id="right", domain="math", parsed={"answer": "\\boxed{7}"}, verifier={"answer": "7"}),
            dict(rollout_id="int_gold", domain="math", parsed={"answer": "0"}, verifier={"answer": 0}),
            dict(rollout_id="no_answer", domain="math", parsed={}, verifier={"answer": "7"}),
            dict(rollout_id="no_gold", domain="math", parsed={"answer": "7"}, verifier={})]
    with MathChecker(workers=1) as mc:
        no_code = SimpleNamespace(execute=lambda jobs: [])  # math rows only: the sandbox gets no job
        got = {v["rollout_id"]: v for v in verdicts(SimpleNamespace(mathcheck=mc, sandbox=no_code), rows)}
    assert {k: v["s_gt"] for k, v in got.items()} == {"right": 1.0, "int_gold": 1.0, "no_answer": 0.0, "no_gold": 0.0}
    assert got["no_answer"]["error"] == "no answer" and got["no_gold"]["tests"]["gold"] == ""
