"""What README.md quotes that can drift from the code: every column and relation name it quotes in backticks is in
the warehouse (or is a stage, a config field or a rejection reason), its first SQL question names every rejection
count of `curriculum_drift`, and the Prefect artifact names it gives are the ones the flows publish."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sage.configs.names import Stage
from sage.configs.schema import SageConfig
from sage.stages.admit import LABEL_FAILURES
from sage.warehouse import Warehouse

README = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")


def _warehouse_names() -> tuple[set[str], dict[str, set[str]]]:
    """(every column name, each relation's columns) of a fresh warehouse."""
    with Warehouse.open(":memory:") as wh:
        rows = wh.rows("SELECT table_name, column_name FROM information_schema.columns")
    relations: dict[str, set[str]] = {}
    for r in rows:
        relations.setdefault(r["table_name"], set()).add(r["column_name"])
    return {r["column_name"] for r in rows}, relations


def _config_fields() -> set[str]:
    return {name for section in SageConfig.model_fields.values() for name in section.annotation.model_fields}


def test_every_snake_case_name_the_readme_quotes_exists():
    """A backticked `snake_case` name is a warehouse column or relation, a stage, a config field or a rejection
    reason: a renamed column (or one that never existed, such as `probe_answers` as a column) fails here."""
    columns, relations = _warehouse_names()
    known = columns | set(relations) | {s.value for s in Stage} | _config_fields() | LABEL_FAILURES
    known |= {"entry_point"}  # a code question's verifier key (`questions.verifier`)
    quoted = set(re.findall(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`", README))
    assert quoted and sorted(quoted - known) == []


def test_the_warehouse_tables_name_only_real_columns():
    """In the tables of tables and views, each row's backticked names are that relation's columns or another relation
    the tables list (`probe_answers` once stood for three columns of `curriculum_audit`)."""
    _, relations = _warehouse_names()
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", README.split("## The warehouse", 1)[1].split("### Questions", 1)[0],
                      re.M)
    assert len(rows) >= 20
    listed = {name for name, _ in rows}
    for name, text in rows:
        assert name in relations, name
        for quoted in re.findall(r"`([a-z_]+)`", text):  # its own column, or another relation the README lists
            assert quoted in relations[name] or quoted in listed, f"{name}: `{quoted}`"


def test_the_first_question_accounts_for_every_rejection():
    _, relations = _warehouse_names()
    first = README.split("```sql", 1)[1].split(";\n", 1)[0]
    counts = {c for c in relations["curriculum_drift"] if c.startswith("rejected")}
    assert len(counts) >= 8 and {c for c in counts if not re.search(rf"\b{c}\b", first)} == set()


def _published(monkeypatch) -> set[str]:
    """The artifact keys the flows publish for run `run` iteration 7 (stage `train`), as README writes them."""
    from sage.flows import artifacts, evolve, iteration
    from sage.warehouse.queries import iteration_summary

    keys: list[str] = []

    def record(*args, key: str, **kwargs):
        keys.append(key)
        return "id"

    for module, names in [(iteration, ("create_table_artifact", "create_markdown_artifact")),
                          (evolve, ("create_table_artifact",))]:
        for name in names:
            monkeypatch.setattr(module, name, record)
    import prefect.artifacts

    for name in ("create_progress_artifact", "create_table_artifact", "update_progress_artifact"):
        monkeypatch.setattr(prefect.artifacts, name, record)
    monkeypatch.setattr(artifacts, "_in_prefect_run", lambda: True)
    with Warehouse.open(":memory:") as wh:
        iteration._publish("run", 7, iteration_summary(wh, "run", 7), [])
    evolve._publish("run", 7, [])
    artifacts.LiveArtifacts().report("run", 7, "train", 2, 2, unit="steps", metrics={"step": 2})
    return {re.sub(r"^run-", "<run>-", k).replace("-7", "-<k>").replace("-train-progress", "-<stage>-progress")
            for k in keys}


@pytest.mark.fast
def test_the_artifact_names_are_the_published_ones(monkeypatch):
    published = _published(monkeypatch)
    quoted = set(re.findall(r"`(<run>-[^`]+)`", README))
    assert len(published) >= 9 and quoted == published, (sorted(quoted - published), sorted(published - quoted))
