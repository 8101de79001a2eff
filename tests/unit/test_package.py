"""The wheel's package list (pyproject.toml) holds every folder of the package: a new one is not left out."""
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_in_the_wheel():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join(d.relative_to(REPO / "plugins").parts) for d in (REPO / "plugins" / "ledgerbatch").rglob("*")
               if d.is_dir() and d.name != "__pycache__" and (d / "__init__.py").exists()}
    folders.add("ledgerbatch")
    listed = set(config["packages"])
    shipped = {"ledgerbatch._sql", "ledgerbatch._sql.migrations", "ledgerbatch._sql.queries", "ledgerbatch._spark_jobs"}
    assert folders == listed - shipped
    assert config["package-dir"] == {"": "plugins", "ledgerbatch._sql": "sql", "ledgerbatch._spark_jobs": "spark_jobs"}
