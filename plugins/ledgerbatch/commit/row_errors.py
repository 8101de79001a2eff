"""Which of the server's refusals are a row's fault: the one place that decides it (by SQLSTATE).

A row's fault is what one row's INSERT raises while the other rows pass. commit/rejects.py finds such rows
(by a scan or by bisection) and quarantines them with their SQLSTATE and message; every other error is the
server's state, the operator's or a bug, and fails the batch with nothing quarantined.

| SQLSTATE | what it is | whose fault |
| --- | --- | --- |
| class `22` | data exception: a value too long, out of range, a division by zero in a CHECK | the row's |
| class `23` | integrity: CHECK (NOT VALID ones too), NOT NULL, unique, foreign key, exclusion | the row's |
| class `54` | program limit exceeded: a key longer than a btree index entry may be (`54000`), a row too big | the row's |
| class `P0` | PL/pgSQL: a trigger's `RAISE EXCEPTION` (`P0001`), `P0002`/`P0003` from its queries, `P0004` | the row's |
| not a class PostgreSQL defines | a trigger's own code, `RAISE ... USING ERRCODE = 'LB001'` | the row's |
| any other class (`08`, `40`, `42`, `53`, `55`, `57`, `XX`, ...) | the connection, a conflict, a privilege, resources, ... | not the row's |

A trigger that raises a code of a class PostgreSQL defines (`USING ERRCODE = '40001'`) is judged by that
class, as the server's own error of that code would be.
"""
from __future__ import annotations

# data exception, integrity constraint violation, program limit exceeded, PL/pgSQL error
ROW_ERROR_CLASSES = frozenset({"22", "23", "54", "P0"})

# Every class of PostgreSQL's own SQLSTATEs (Appendix A, "PostgreSQL Error Codes"; src/backend/utils/errcodes.txt).
# A code whose class is none of these was made up by the target's owner (a trigger's RAISE ... USING ERRCODE).
POSTGRESQL_CLASSES = frozenset({
    "00", "01", "02", "03", "08", "09", "0A", "0B", "0F", "0L", "0P", "0Z", "10", "20", "21", "22", "23", "24", "25",
    "26", "27", "28", "2B", "2D", "2F", "34", "38", "39", "3B", "3D", "3F", "40", "42", "44", "53", "54", "55", "57",
    "58", "72", "F0", "HV", "P0", "XX",
})


def row_error(sqlstate: str | None) -> bool:
    """Whether an error with this SQLSTATE is the refused row's fault (the table above). None or a string that
    is no SQLSTATE (not five characters): not a row's."""
    if not sqlstate or len(sqlstate) != 5:
        return False
    sqlstate = sqlstate.upper()
    return sqlstate[:2] in ROW_ERROR_CLASSES or sqlstate[:2] not in POSTGRESQL_CLASSES


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE the server gave an error (a SQLAlchemy DBAPIError wrapping psycopg2's, or psycopg2's
    own), None where it gave none (a lost connection, an error of the driver or the product)."""
    return getattr(getattr(exc, "orig", exc), "pgcode", None) or None


def refused_row(exc: BaseException) -> bool:
    """Whether the server refused a row, not the statement's circumstances."""
    return row_error(sqlstate_of(exc))
