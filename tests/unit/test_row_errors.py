"""Which SQLSTATEs are a row's fault (commit/row_errors.py): the table in its docstring, row by row."""
import psycopg2
import pytest
from sqlalchemy.exc import DataError, OperationalError

from ledgerbatch.commit.row_errors import POSTGRESQL_CLASSES, refused_row, row_error, sqlstate_of

ROWS_FAULT = {
    "22001": "string_data_right_truncation (a varchar(n) the user narrowed)",
    "22012": "division_by_zero (a CHECK that divides)",
    "22P02": "invalid_text_representation",
    "23502": "not_null_violation",
    "23503": "foreign_key_violation",
    "23505": "unique_violation",
    "23514": "check_violation (NOT VALID ones too)",
    "23P01": "exclusion_violation",
    "54000": "program_limit_exceeded (index row size exceeds btree maximum: a key too long)",
    "54001": "statement_too_complex",
    "P0001": "raise_exception (a trigger's RAISE EXCEPTION)",
    "P0002": "no_data_found (a trigger's SELECT INTO STRICT)",
    "P0003": "too_many_rows",
    "P0004": "assert_failure (a trigger's ASSERT)",
    "LB001": "a trigger's own code (RAISE ... USING ERRCODE = 'LB001')",
    "ZZ999": "a trigger's own code",
    "U0001": "a trigger's own code",
}
NOT_THE_ROWS = {
    "08006": "connection_failure",
    "0A000": "feature_not_supported",
    "25006": "read_only_sql_transaction (a standby)",
    "40001": "serialization_failure",
    "40P01": "deadlock_detected",
    "42501": "insufficient_privilege",
    "42P01": "undefined_table",
    "53100": "disk_full",
    "53200": "out_of_memory",
    "55P03": "lock_not_available (lock timeout)",
    "57014": "query_canceled (statement timeout)",
    "57P01": "admin_shutdown",
    "58030": "io_error",
    "XX000": "internal_error",
    "XX001": "data_corrupted",
}


@pytest.mark.parametrize("sqlstate", list(ROWS_FAULT))
def test_the_rows_fault(sqlstate):
    assert row_error(sqlstate), ROWS_FAULT[sqlstate]


@pytest.mark.parametrize("sqlstate", list(NOT_THE_ROWS))
def test_not_the_rows_fault(sqlstate):
    assert not row_error(sqlstate), NOT_THE_ROWS[sqlstate]


@pytest.mark.parametrize("sqlstate", [None, "", "2350", "235140", "lb001x"])
def test_no_sqlstate_is_not_a_row(sqlstate):
    assert not row_error(sqlstate)


def test_every_class_postgresql_defines_is_known():
    """psycopg2's own table of PostgreSQL's codes (errorcodes): a class missing from POSTGRESQL_CLASSES would
    make every error of it a row's fault."""
    from psycopg2 import errorcodes

    classes = {code[:2] for name, code in vars(errorcodes).items()
               if name.isupper() and isinstance(code, str) and len(code) == 5 and not name.startswith("CLASS_")}
    assert classes <= POSTGRESQL_CLASSES, sorted(classes - POSTGRESQL_CLASSES)


class _PgError(psycopg2.Error):
    def __init__(self, pgcode):
        super().__init__("boom")
        self._code = pgcode

    @property
    def pgcode(self):
        return self._code


def test_the_sqlstate_is_read_from_the_drivers_error():
    assert sqlstate_of(DataError("INSERT", {}, _PgError("22001"))) == "22001"
    assert sqlstate_of(_PgError("LB001")) == "LB001"
    assert sqlstate_of(OperationalError("SELECT 1", {}, psycopg2.OperationalError("server closed"))) is None
    assert sqlstate_of(ValueError("a bug")) is None
    assert refused_row(OperationalError("INSERT", {}, _PgError("54000")))  # psycopg2 maps class 54 to OperationalError
    assert not refused_row(OperationalError("SELECT 1", {}, psycopg2.OperationalError("server closed")))
