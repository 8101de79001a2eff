"""The executors' libpq string (config.libpq_dsn) names exactly what the driver connects to.

The driver is SQLAlchemy over psycopg2: what it hands psycopg2.connect is caught at its `do_connect` event;
the executors' string is parsed by libpq itself (psycopg2.extensions.parse_dsn). The two must agree for every
URL form SQLAlchemy and libpq accept."""
import psycopg2.extensions
import pytest
from sqlalchemy import create_engine, event

from ledgerbatch.config import libpq_dsn


class _Caught(Exception):
    pass


def driver_connects_with(url: str) -> dict[str, str]:
    """The keyword arguments SQLAlchemy's engine passes psycopg2.connect for `url` (nothing is connected)."""
    engine = create_engine(url)
    seen = {}

    @event.listens_for(engine, "do_connect")
    def catch(dialect, conn_rec, cargs, cparams):
        assert not cargs
        seen.update({k: str(v) for k, v in cparams.items()})
        raise _Caught

    with pytest.raises(_Caught):
        engine.connect()
    engine.dispose()
    return seen


SPECIAL = "p@ss w'o\\rd:/?#&="  # every character a URL or a libpq string treats specially

URLS = [
    "postgresql+psycopg2://lb:pw@db:5433/ledger",
    "postgresql+psycopg2://lb@db/ledger",
    "postgresql+psycopg2://lb@/ledger?port=5433&host=db",  # port before host
    "postgresql+psycopg2://lb@/ledger?host=db&port=5433",
    "postgresql+psycopg2://lb@/ledger?host=db:5433",
    "postgresql+psycopg2://lb@/ledger?host=db-a:5432&host=db-b:5433&target_session_attrs=read-write",
    "postgresql+psycopg2://lb@/ledger?host=db-a&host=db-b:5434",  # one host on the default port
    "postgresql+psycopg2://lb@/ledger?host=db-a,db-b&port=5433,5434",  # libpq's lists
    "postgresql+psycopg2://lb@/ledger?port=5433,5434&host=db-a,db-b",
    "postgresql+psycopg2://lb@db:5433/ledger?host=other",  # the query's host wins, the authority's port stays
    "postgresql+psycopg2://lb@/ledger?host=/run/postgresql",  # a Unix socket directory
    "postgresql+psycopg2://lb@/ledger?host=/run/postgresql&port=5433",
    "postgresql+psycopg2:///?service=ledger",  # pg_service.conf
    "postgresql+psycopg2://lb@/ledger?service=ledger&sslmode=verify-full&sslrootcert=/etc/ca.pem",
    "postgresql+psycopg2://lb@[::1]:5433/ledger",  # IPv6
    "postgresql+psycopg2://l%40b:p%40ss%20w%27o%5Crd%3A%2F%3F%23%26%3D@db:5433/led%2Fger?application_name=a%20b",
    "postgresql+psycopg2://lb@db/ledger?connect_timeout=5&options=-c%20statement_timeout%3D0",
]


@pytest.mark.parametrize("url", URLS)
def test_the_executors_reach_what_the_driver_reaches(url):
    assert psycopg2.extensions.parse_dsn(libpq_dsn(url)) == driver_connects_with(url)


def test_special_characters_in_the_user_and_password_survive():
    parsed = psycopg2.extensions.parse_dsn(libpq_dsn(URLS[-2]))
    assert (parsed["user"], parsed["password"], parsed["dbname"]) == ("l@b", SPECIAL, "led/ger")


def test_port_order_in_the_query_does_not_matter():
    for url in ("postgresql+psycopg2://lb@/ledger?port=5433&host=db", "postgresql+psycopg2://lb@/ledger?host=db&port=5433"):
        assert psycopg2.extensions.parse_dsn(libpq_dsn(url))["port"] == "5433"


def test_a_url_of_another_postgresql_driver_names_the_same_server():
    """psycopg (3) is SQLAlchemy 2.1's default for postgresql://; its connect arguments are libpq's too."""
    assert libpq_dsn("postgresql://lb@/ledger?port=5433&host=db") == \
        libpq_dsn("postgresql+psycopg2://lb@/ledger?port=5433&host=db")
