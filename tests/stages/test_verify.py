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


def test_one_hostile_answer_keeps_the_honest_verdicts_of_its_batch():
    from sage.configs.schema import SandboxConfig
    from sage.engines.verify.sandbox import Sandbox

    hostile = ("import os, sys\ndef f(x):\n    fr = sys._getframe(1).f_locals\n    body = b'[\"out\",0,{}]'\n"
               "    os.write(fr['fd_out'], fr['nonce'] + b' ' + str(len(body)).encode() + b'\\n' + body)\n"
               "    os._exit(0)\n")
    verifier = {"entry_point": "f", "inputs": [[2], [3]], "outputs": [4, 6]}
    rows = [dict(rollout_id=f"honest{i}", domain="code", parsed={"answer": "def f(x):\n    return 2 * x\n"},
                 verifier=verifier) for i in range(3)]
    rows.insert(1, dict(rollout_id="hostile", domain="code", parsed={"answer": hostile}, verifier=verifier))
    no_math = SimpleNamespace(check_many=lambda pairs: [])  # code rows only
    engines = SimpleNamespace(mathcheck=no_math, sandbox=Sandbox(SandboxConfig(timeout_s=10, workers=2)))
    got = {v["rollout_id"]: v for v in verdicts(engines, rows)}
    assert {k: v["s_gt"] for k, v in got.items()} == {"honest0": 1.0, "hostile": 0.0, "honest1": 1.0, "honest2": 1.0}
    assert got["hostile"]["error"] == "protocol_error" and got["hostile"]["tests"]["status"] == "protocol_error"


def test_verify_without_solver_answers_is_never_done(tmp_path):
    """The solve stage wrote nothing: verify raises (the flow records it failed), it does not end `done` on 0 rows."""
    import pytest

    from sage.configs import load_config
    from sage.stages.context import StageContext
    from sage.stages.verify import run_solve
    from sage.warehouse import Warehouse

    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        ctx = StageContext(load_config("cpu"), wh, run_id="r", iteration=3)
        with pytest.raises(RuntimeError, match=r"iteration 3 of run 'r' has no Solver answers to verify; run the "
                                               r"solve stage first \(`sage stage solve --run r --iteration 3`\)"):
            run_solve(ctx)
        assert wh.count("verdicts") == 0
