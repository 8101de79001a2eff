import pytest

from ledgerbatch.errors import SpecError
from ledgerbatch.sqlfiles import Fragment, migrations, query


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
