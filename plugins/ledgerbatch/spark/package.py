"""Shipping the package to executors: a zip on --py-files, addPyFile or a Connect artifact."""
from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # plugins/ledgerbatch


def package_zip(directory: str | Path | None = None) -> str:
    """The package as a zip for executors (`--py-files`, addPyFile below, a Connect session's artifact): its
    .py files only.

    Executors import it from the zip ahead of anything installed there, so they always run the
    driver's version. Their Python still needs confluent-kafka, pyarrow and psycopg2 installed.
    """
    out = Path(directory or tempfile.mkdtemp(prefix="ledgerbatch-pyfiles-")) / "ledgerbatch.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(PACKAGE_DIR.rglob("*.py")):
            zf.write(path, path.relative_to(PACKAGE_DIR.parent).as_posix())
    return str(out)
