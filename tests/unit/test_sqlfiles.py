import re
from pathlib import Path

import pytest

from ledgerbatch.errors import SpecError
from ledgerbatch.sqlfiles import SQL_DIR, Fragment, _queries, migrations, query

PACKAGE = Path(__file__).resolve().parents[2] / "plugins" / "ledgerbatch"


def test_identifiers_are_validated_and_quoted():
    assert 'ledger_staging."b1_a2", ledger_staging."b1_a2_bad"' in query("drop_staging", staging="b1_a2", bad="b1_a2_bad")
    with pytest.raises(SpecError):
        query("drop_staging", staging='x"; DROP TABLE y; --', bad="b")


def test_lists_and_fragments():
    sql = query("insert_append", schema="public", table="t", staging="b1_a1", columns=["a", "b"])
    assert 'INSERT INTO "public"."t" ("a", "b", _topic' in sql
    assert query("create_staging", staging="s", bad="s_bad", defs=Fragment('"a" text')).count('"a" text') == 1


def test_migrations_are_numbered_in_order():
    versions = [v for v, _, _ in migrations()]
    assert versions == sorted(versions) and versions[0] == 1


def test_only_the_ledger_package_runs_queries_of_the_ledger_schema():
    """ledger/ is the one door to the `ledger` schema: every query naming it is run from there only."""
    ledger_queries = {name for name, sql in _queries().items() if re.search(r"\bledger\.", sql)}
    assert "mark_staged" in ledger_queries and "insert_quarantine" in ledger_queries
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "ledger":
            continue
        source = path.read_text()
        used = set(re.findall(r"query\(\"(\w+)\"", source))
        assert not used & ledger_queries, f"{path.name} runs ledger queries {sorted(used & ledger_queries)}"
        assert not re.search(r"text\([^)]*\bledger\.", source), f"{path.name} runs inline SQL on the ledger schema"


def test_one_parameter_style_per_sql_file():
    for path in sorted((SQL_DIR / "queries").glob("*.sql")):
        body = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("--"))
        styles = {"psycopg2" for _ in re.findall(r"%\(\w+\)s", body)} | {"sqlalchemy" for _ in re.findall(r"(?<!:):\w+", body)}
        assert len(styles) <= 1, f"{path.name} mixes parameter styles"
