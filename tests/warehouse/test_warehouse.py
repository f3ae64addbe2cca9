import multiprocessing as mp
import re
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from sage.configs.names import Purpose, Role, Stage
from sage.warehouse import Warehouse, WarehouseBusy, content_id, norm_hash
from sage.warehouse.db import JSON_COLUMNS, decode_json, migrations
from sage.warehouse.queries import questions_by_id, rollouts_for


def _run_row(run_id="r1"):
    return dict(run_id=run_id, config={"a": 1}, config_hash="h", base_model="m", seed=0)


def test_migrations_apply_once_and_reapply_as_noop(tmp_path):
    path = tmp_path / "w.duckdb"
    with Warehouse.open(path, migrate=False) as wh:
        assert wh.migrate() == [v for v, _, _ in migrations()]
        assert wh.migrate() == []
        assert wh.schema_version() == len(migrations())
    with Warehouse.open(path) as wh:  # reopening applies nothing
        assert wh.rows("SELECT count(*) AS n FROM migrations")[0]["n"] == len(migrations())


def test_every_table_and_view_exists(tmp_path):
    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        names = {r["table_name"] for r in wh.rows("SELECT table_name FROM information_schema.tables")}
    for t in ["runs", "iterations", "stage_runs", "questions", "rollouts", "verdicts", "scores", "checkpoints",
              "evaluations", "plans", "migrations", "pool", "curriculum_drift", "role_rewards", "gate_stats",
              "validation_curve"]:
        assert t in names


def _id_in_child(q):
    from sage.warehouse import content_id

    q.put(content_id("rollout", "run", 3, {"b": 2, "a": 1}, [1, 2]))


def test_ids_stable_across_processes():
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_id_in_child, args=(q,))
    p.start()
    p.join(60)
    assert q.get(timeout=5) == content_id("rollout", "run", 3, {"a": 1, "b": 2}, [1, 2])
    assert norm_hash("What is  2+2 ?") == norm_hash("what is 2 2")
    assert content_id("a", 1) != content_id("a", "1")


def test_reinsert_changes_no_row(tmp_path):
    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        assert wh.insert_batch("runs", [_run_row("r1"), _run_row("r2")]) == 2
        before = wh.rows("SELECT * FROM runs ORDER BY run_id")
        changed = dict(_run_row("r1"), base_model="other")
        assert wh.insert_batch("runs", [changed, _run_row("r3")]) == 1
        after = wh.rows("SELECT * FROM runs WHERE run_id IN ('r1', 'r2') ORDER BY run_id")
        assert after == before


def test_batch_is_one_transaction(tmp_path):
    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        bad = [_run_row("ok1"), dict(_run_row("bad"), seed="not a number")]
        with pytest.raises(pa.ArrowInvalid):  # the bad row fails its conversion to the table's Arrow schema
            wh.insert_batch("runs", bad)
        assert wh.count("runs") == 0


def test_json_and_list_columns_roundtrip(tmp_path):
    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        wh.insert_batch("questions", [dict(question_id="q1", origin="seed", domain="code", text="t",
                                           verifier={"entry_point": "f", "inputs": [[1]], "outputs": [2]},
                                           norm_hash="n")])
        got = wh.rows("SELECT verifier->>'$.entry_point' AS e, verifier->'$.outputs' AS o FROM questions")
        assert got == [{"e": "f", "o": "[2]"}]


def _rollout_row(rollout_id, parsed):
    return dict(rollout_id=rollout_id, run_id="r", iteration=1, stage=Stage.PLAN, role=Role.PLANNER,
                purpose=Purpose.PLAN, question_id="q1", template="planner@2", prompt_text="p", completion_text="c",
                prompt_ids=[1], completion_ids=[2], sample_index=0, seed=0, parsed=parsed)


def test_named_queries_hand_json_columns_decoded_and_never_null(tmp_path):
    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        wh.insert_batch("questions", [dict(question_id="q1", origin="seed", domain="math", text="t",
                                           verifier={"answer": "7"}, norm_hash="n")])
        wh.insert_batch("rollouts", [_rollout_row("a", {"plan": "1. add"}), _rollout_row("b", None),
                                     _rollout_row("c", "null"), _rollout_row("d", "[1, 2]")])
        parsed = {r["rollout_id"]: r["parsed"] for r in rollouts_for(wh, "r", 1, Purpose.PLAN)}
        assert parsed == {"a": {"plan": "1. add"}, "b": {}, "c": {}, "d": {}}  # NULL, null, non-object: {}
        assert questions_by_id(wh, ["q1"])["q1"]["verifier"] == {"answer": "7"}
        assert wh.rows("SELECT parsed FROM rollouts WHERE rollout_id = 'a'") == [{"parsed": '{"plan": "1. add"}'}]


def test_decode_json_gives_a_dict_for_anything_stored():
    assert decode_json('{"answer": 0}') == {"answer": 0}
    assert decode_json({"answer": 0}) == {"answer": 0}
    for bad in (None, "", "null", "not json", "[1]", "3", '"text"'):
        assert decode_json(bad) == {}


def test_json_columns_lists_every_json_column(tmp_path):
    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        stored = {r["column_name"] for r in wh.rows(
            "SELECT column_name FROM information_schema.columns c JOIN information_schema.tables t "
            "USING (table_schema, table_name) WHERE t.table_type = 'BASE TABLE' AND c.data_type = 'JSON'")}
    assert stored == JSON_COLUMNS


def test_names_are_the_stored_strings():
    """The values are stored and hashed into row ids: changing one changes every id that contains it."""
    assert [str(r) for r in Role] == ["challenger", "planner", "critic", "solver"]
    assert [str(p) for p in Purpose] == ["challenge", "critique_question", "probe", "plan", "critique_plan",
                                         "solve", "validate", "validate_plan", "validate_critique", "validate_hinted"]
    assert [str(s) for s in Stage] == ["seed", "challenge", "critique_question", "probe", "verify_probe", "admit",
                                       "plan", "critique_plan", "solve", "verify", "score", "train", "validate"]
    assert content_id("unit", Purpose.SOLVE, Role.SOLVER) == content_id("unit", "solve", "solver")


def test_second_writer_gets_clear_error_and_file_untouched(tmp_path):
    path = tmp_path / "w.duckdb"
    wh = Warehouse.open(path)
    wh.insert_batch("runs", [_run_row()])
    wh.checkpoint()
    size, mtime = path.stat().st_size, path.stat().st_mtime_ns
    code = ("import sys\nfrom sage.warehouse import Warehouse, WarehouseBusy\n"
            "try:\n    Warehouse.open(sys.argv[1])\nexcept WarehouseBusy as e:\n    print(e); sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3
    import os

    assert f"warehouse in use by PID {os.getpid()}" in r.stdout
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (size, mtime)
    wh.close()


def test_cli_second_writer_exits_nonzero(tmp_path):
    wh = Warehouse.open(tmp_path / "warehouse.duckdb")
    r = subprocess.run([sys.executable, "-m", "sage.flows.cli", "sql", "SELECT 1", "--write", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    wh.close()
    assert r.returncode == 3 and "warehouse in use by PID" in r.stderr


def _read_in_subprocess(path, sql: str) -> subprocess.Popen:
    code = ("import sys\nfrom sage.warehouse import Warehouse\n"
            "with Warehouse.open(sys.argv[1], read_only=True) as wh:\n    print(wh.scalar(sys.argv[2]))\n")
    return subprocess.Popen([sys.executable, "-c", code, str(path), sql], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_reader_gets_in_while_the_writer_is_open_and_between_its_batches(tmp_path):
    """The writer holds the file only inside a batch: a reader started while the writer holds it waits, and
    reads once the batch is committed; one started between batches reads at once."""
    path = tmp_path / "w.duckdb"
    with Warehouse.open(path) as wh:
        wh.insert_batch("runs", [_run_row("r1")])
        assert _read_in_subprocess(path, "SELECT count(*) FROM runs").communicate(timeout=60)[0].strip() == "1"
        with wh.transaction():
            wh.insert("runs", [_run_row("r2")])
            reader = _read_in_subprocess(path, "SELECT string_agg(run_id ORDER BY run_id) FROM runs")
            time.sleep(2)  # the reader is waiting now (it gives up only after READ_WAIT_S)
            assert reader.poll() is None
        out, errors = reader.communicate(timeout=60)
        assert reader.returncode == 0, errors
        assert out.strip() == "r1,r2"  # the batch it waited for, committed whole


def test_the_writer_waits_for_a_reader_instead_of_failing(tmp_path):
    path = tmp_path / "w.duckdb"
    with Warehouse.open(path) as wh:
        wh.insert_batch("runs", [_run_row("r1")])
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], "
                               "read_only=True); print('held', flush=True); time.sleep(2)", str(path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with Warehouse.open(path) as wh:  # opening (migrations check) and the batch both wait for the reader
            assert wh.insert_batch("runs", [_run_row("r2")]) == 1
            assert holder.poll() is not None  # it could only write once the reader had gone
    finally:
        holder.kill()
        holder.wait()


def test_views_on_hand_built_rows(tmp_path):
    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        wh.insert_batch("runs", [_run_row("r")])
        wh.insert_batch("iterations", [dict(run_id="r", iteration=1)])
        qs = [dict(question_id="s1", origin="seed", domain="math", text="seed", verifier={"answer": "1"},
                   norm_hash="a")]
        for i, (adm, reason, sq, d) in enumerate([(True, None, 0.9, 0.5), (False, "low_quality", 0.2, None),
                                                  (False, "duplicate", 0.8, 0.0)]):
            qs.append(dict(question_id=f"g{i}", origin="generated", domain="math", text="x" * (i + 1),
                           verifier={"answer": "1"}, norm_hash=f"h{i}", run_id="r", iteration=1, s_q=sq,
                           difficulty=d, admitted=adm, admitted_iteration=1 if adm else None, rejection_reason=reason))
        wh.insert_batch("questions", qs)
        wh.insert_batch("plans", [dict(plan_id="p1", run_id="r", iteration=1, question_id="s1", s_p=0.8, passed=True),
                                  dict(plan_id="p2", run_id="r", iteration=1, question_id="s1", s_p=0.1, passed=False)])
        drift = wh.rows("SELECT * FROM curriculum_drift")[0]
        assert (drift["pool_size"], drift["generated"], drift["admitted"], drift["rejected"]) == (2, 3, 1, 2)
        assert (drift["rejected_low_quality"], drift["rejected_duplicate"]) == (1, 1)
        assert drift["mean_s_q"] == pytest.approx((0.9 + 0.2 + 0.8) / 3)
        assert drift["mean_difficulty"] == pytest.approx(0.25)
        assert wh.scalar("SELECT count(*) FROM pool WHERE run_id = 'r'") == 2
        gate = wh.rows("SELECT plans, passed, withheld, pass_rate FROM gate_stats")[0]
        assert gate == {"plans": 2, "passed": 1, "withheld": 1, "pass_rate": 0.5}


def test_novelty_and_diversity_views(tmp_path):
    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        wh.insert_batch("runs", [_run_row("r")])
        q = lambda qid, origin, text, it=None: dict(  # noqa: E731
            question_id=qid, origin=origin, domain="math", text=text, verifier={"answer": "1"}, norm_hash=qid,
            run_id=None if origin == "seed" else "r", iteration=it, admitted=origin == "generated" or None,
            admitted_iteration=it)
        wh.insert_batch("questions", [
            q("s", "seed", "what is two plus two"),              # trigrams: what is two / is two plus / two plus two
            q("a", "generated", "what is two plus three", 1),    # 3 trigrams, 2 of them in the seed
            q("b", "generated", "how many apples are left", 2),  # 3 trigrams, all new
            q("c", "generated", "what is two times two", 2),     # 'what is two' seen in seeds and iteration 1
        ])
        rows = {r["iteration"]: r for r in wh.rows("SELECT * FROM curriculum_novelty ORDER BY iteration")}
        assert rows[1]["trigrams"] == 3 and rows[1]["novelty_vs_seeds"] == pytest.approx(1 / 3)
        assert rows[1]["novelty_vs_earlier"] == 1.0
        assert rows[2]["trigrams"] == 6 and rows[2]["distinct_trigrams"] == 6 and rows[2]["diversity"] == 1.0
        assert rows[2]["novelty_vs_seeds"] == pytest.approx(5 / 6)
        assert rows[2]["novelty_vs_earlier"] == pytest.approx(5 / 6)


def _as_older_version(path) -> None:
    """Make the file look written before the last migration: its objects and columns gone, its version unrecorded."""
    import duckdb

    from sage.warehouse.db import migrations

    last, _, sql = migrations()[-1]
    with duckdb.connect(str(path)) as con:
        for kind, name in re.findall(r"CREATE (?:OR REPLACE )?(TABLE|VIEW) (\w+)", sql)[::-1]:
            con.execute(f"DROP {kind} {name}")
        for table, column in re.findall(r"ALTER TABLE (\w+) ADD COLUMN (\w+)", sql):
            # DuckDB drops no column of an indexed table: the indexes go first and come back after
            indexes = [q for (q,) in con.execute("SELECT sql FROM duckdb_indexes() WHERE table_name = ?",
                                                 [table]).fetchall()]
            for name, in con.execute("SELECT index_name FROM duckdb_indexes() WHERE table_name = ?",
                                     [table]).fetchall():
                con.execute(f"DROP INDEX {name}")
            con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
            for q in indexes:
                con.execute(q)
        con.execute("DELETE FROM migrations WHERE version = ?", [last])


def test_a_reader_upgrades_a_warehouse_written_by_an_older_version(tmp_path):
    from sage.warehouse.db import migrations

    Warehouse.open(tmp_path / "w.duckdb").close()
    _as_older_version(tmp_path / "w.duckdb")
    with Warehouse.open(tmp_path / "w.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT max(version) FROM migrations") == migrations()[-1][0]


def test_a_reader_of_an_older_warehouse_a_writer_holds_is_told_so(tmp_path):
    Warehouse.open(tmp_path / "w.duckdb").close()
    _as_older_version(tmp_path / "w.duckdb")
    hold = ("import sys, time; from sage.warehouse import Warehouse; "
            "w = Warehouse.open(sys.argv[1], migrate=False); print('held', flush=True); time.sleep(60)")
    writer = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "w.duckdb")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert writer.stdout.readline().strip() == "held"
        with pytest.raises(WarehouseBusy, match=f"in use by PID {writer.pid}"):
            Warehouse.open(tmp_path / "w.duckdb", read_only=True)
    finally:
        writer.kill()
        writer.wait()


def _questions(n: int, tag: str = "") -> list[dict]:
    return [dict(question_id=f"q{tag}{i}", origin="seed", domain="math", text=f"{i}+1?" * 20,
                 verifier={"answer": str(i + 1)}, norm_hash=f"h{tag}{i}") for i in range(n)]


def test_the_open_check_finds_an_overwritten_block_wherever_it_is(tmp_path):
    """DuckDB checks a block's checksum only when a query reads it; the open check reads every block, so 200
    bytes overwritten in any block (table rows, an index, the catalog) are found before anything is written."""
    import os
    import shutil

    import duckdb

    from sage.warehouse.errors import WarehouseDamaged

    good = tmp_path / "good.duckdb"
    with Warehouse.open(good) as wh:
        wh.insert_batch("questions", _questions(500))
    with duckdb.connect(str(good), read_only=True) as con:
        size, used = con.execute("SELECT block_size, used_blocks FROM pragma_database_size()").fetchone()
    assert used >= 3
    for block in range(used):
        bad = tmp_path / f"bad{block}.duckdb"
        shutil.copy(good, bad)
        with open(bad, "r+b") as f:
            f.seek(3 * 4096 + block * size + 5000)
            f.write(os.urandom(200))
        before = bad.read_bytes()
        for read_only in (True, False):
            with pytest.raises(WarehouseDamaged, match=rf"the warehouse {re.escape(str(bad))} is damaged \("
                                                       r".*; nothing was changed"):
                Warehouse.open(bad, read_only=read_only)
        assert bad.read_bytes() == before


def test_a_healthy_warehouse_with_free_blocks_opens(tmp_path):
    """Blocks freed by deletes keep their old contents and checksums: not damage."""
    import duckdb

    path = tmp_path / "w.duckdb"
    with Warehouse.open(path) as wh:
        for k in range(3):
            wh.insert_batch("questions", _questions(3000, f"{k}-"))
            wh.checkpoint()
        wh.execute("DELETE FROM questions WHERE question_id LIKE 'q1-%'")
        wh.checkpoint()
    with duckdb.connect(str(path), read_only=True) as con:
        free = con.execute("SELECT free_blocks FROM pragma_database_size()").fetchone()[0]
    assert free > 0
    with Warehouse.open(path, read_only=True) as wh:
        assert wh.count("questions") == 6000
    with Warehouse.open(path) as wh:
        assert wh.count("questions") == 6000


def test_a_snapshot_is_the_committed_warehouse_and_a_client_holding_the_old_one_keeps_it(tmp_path):
    """`Warehouse.snapshot` writes a whole copy any DuckDB client opens read-only: a client holding the previous
    copy open keeps reading it, undisturbed, while the next one is written; the writer keeps its lock."""
    import duckdb

    from sage.warehouse import snapshot_path

    path = tmp_path / "w.duckdb"
    wh = Warehouse.open(path)
    wh.insert_batch("runs", [_run_row("r1")])
    target = wh.snapshot()
    assert target == snapshot_path(path) == tmp_path / "w.snapshot.duckdb"
    held = duckdb.connect(str(target), read_only=True)          # an idle client that never lets go
    assert held.execute("SELECT list(run_id) FROM runs").fetchone()[0] == ["r1"]
    wh.insert_batch("runs", [_run_row("r2")])                    # the writer is not held up by it
    assert wh.snapshot() == target
    assert held.execute("SELECT list(run_id ORDER BY run_id) FROM runs").fetchone()[0] == ["r1"]   # its own copy
    # a new client (another process: DuckDB shares one open database per file within a process) sees the new
    # copy, views included
    code = ("import duckdb, sys\ncon = duckdb.connect(sys.argv[1], read_only=True)\n"
            "print(con.execute('SELECT string_agg(run_id, \\',\\' ORDER BY run_id) FROM runs').fetchone()[0],"
            " con.execute('SELECT count(*) FROM curriculum_drift').fetchone()[0])")
    r = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["r1,r2", "0"], r.stderr
    held.close()
    assert not list(tmp_path.glob("*.partial"))
    with wh.held(), pytest.raises(RuntimeError, match="drop DuckDB's lock"):
        wh.snapshot()
    wh.close()
    assert Warehouse.open(path, read_only=True).snapshot() is None
    assert Warehouse.open(":memory:").snapshot() is None


def test_a_snapshot_that_cannot_be_written_is_said_and_fails_nothing(tmp_path, caplog):
    from sage.flows.record import publish
    from sage.warehouse import snapshot_path

    path = tmp_path / "w.duckdb"
    snapshot_path(path).mkdir()                                 # where the copy goes, something else stands
    with Warehouse.open(path) as wh:
        wh.insert_batch("runs", [_run_row("r1")])
        publish(wh, snapshot=True)
        assert "the warehouse's read-only copy was not refreshed" in caplog.text
        assert wh.rows("SELECT run_id FROM runs") == [{"run_id": "r1"}]     # committed and checkpointed
        assert not (tmp_path / "w.duckdb.wal").exists()
