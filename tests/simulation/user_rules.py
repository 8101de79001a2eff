"""Rules users add to their own targets (machine.user_ddl), the way they do on big tables: a CHECK added
NOT VALID (old rows are not judged), a trigger that refuses rows with an SQLSTATE of its own, an index, a
deferred foreign key to a table of the user's (every row's customer is there: it refuses nothing, yet it is
checked at the commit's COMMIT, and a partition attached must satisfy it), and a deferred foreign key from a
column of the user's to the target's own key (upsert; the column stays NULL)."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledgerbatch.commit.target import table_exists

DDL = {
    "check": ['ALTER TABLE public."{t}" ADD CONSTRAINT "{t}_positive" CHECK (amount > 0) NOT VALID'],
    "trigger": [
        'CREATE FUNCTION public."{t}_refuse"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
        "IF NEW.amount = 13 THEN RAISE EXCEPTION 'flagged amount' USING ERRCODE = 'LB001'; END IF; "
        "RETURN NEW; END $$",
        'CREATE TRIGGER "{t}_refuse" BEFORE INSERT OR UPDATE ON public."{t}" FOR EACH ROW '
        'EXECUTE FUNCTION public."{t}_refuse"()',
    ],
    "key_index": ['CREATE INDEX "{t}_key" ON public."{t}" (order_id)'],
    "foreign_key": [
        'CREATE TABLE public."{t}_customers" (id text PRIMARY KEY)',
        """INSERT INTO public."{t}_customers" VALUES ('c')""",
        'ALTER TABLE public."{t}" ADD CONSTRAINT "{t}_customer" FOREIGN KEY (customer) '
        'REFERENCES public."{t}_customers" (id) DEFERRABLE INITIALLY DEFERRED',
    ],
    "self_reference": [
        'ALTER TABLE public."{t}" ADD COLUMN parent_id text',
        'ALTER TABLE public."{t}" ADD CONSTRAINT "{t}_parent" FOREIGN KEY (parent_id) '
        'REFERENCES public."{t}" (order_id) DEFERRABLE INITIALLY DEFERRED',
    ],
}


def add(engine, pipe, which: str) -> bool:
    """Add rule `which` to the pipe's target; False when there is no target yet, or the index cannot be
    built over the rows there (a key too long for it)."""
    with engine.begin() as conn:
        if not table_exists(conn, "public", pipe.table):
            return False
        try:
            with conn.begin_nested():
                for statement in DDL[which]:
                    conn.execute(text(statement.format(t=pipe.table)))
        except DBAPIError as exc:
            if getattr(exc.orig, "pgcode", None) != "54000":
                raise
            return False
    return True
