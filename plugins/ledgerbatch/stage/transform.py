"""Query transforms: `transform:` as one Spark SQL query over the view `batch`.

The view holds a batch's good records: the parsed columns, the metadata columns the spec asks for
and the source coordinates `_topic, _partition, _offset` (bad records never reach it). The query's
output decides the target's columns: Spark analyses it over an empty view before anything is read,
and the batch records that output (`ledger.batches.output_schema`) with its shape (model/shape.py), so
its commit publishes exactly the shape that was staged.
"""
from __future__ import annotations

import re

from ledgerbatch.errors import SpecError
from ledgerbatch.formats.parse import ERROR_COLUMNS, staged_struct
from ledgerbatch.formats.schema import COORDINATE_NAMES, METADATA, Column, parse_type
from ledgerbatch.identifiers import check_ident
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.spec.pipeline import MERGES, PipelineSpec

VIEW = "batch"
# What may read columns the query does not name: a star that stands for columns (not a product; count(*)
# aside: it reads none), a NATURAL join.
_STAR = re.compile(r"(?i)(?:^|[,(.]|\bselect|\bdistinct|\ball)\s*\*")
_COUNT_STAR, _NATURAL = re.compile(r"(?i)\bcount\s*\(\s*\*\s*\)"), re.compile(r"(?i)\bnatural\b")
_NUMERIC = {"SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE", "DECIMAL"}
_METADATA_NAMES = {c.name for c in METADATA.values()}


def view_struct(spec: PipelineSpec, names: tuple[str, ...] | None = None):
    """The rows the query sees as `batch` (all of its columns, or `names`): a batch's good records in
    parse.staged_struct's shape without the columns that describe bad ones."""
    from pyspark.sql.types import StructType

    dropped = [c for c in ERROR_COLUMNS if not (c == "_key" and "key" in spec.metadata)]
    fields = [f for f in staged_struct(spec.columns, spec.metadata).fields if f.name not in dropped]
    return StructType([f for f in fields if names is None or f.name in names])


def run_query(spark, view, spec: PipelineSpec):
    """The spec's query over `view` (rows in view_struct's shape) as a DataFrame.

    `batch` is bound inside the statement (a CTE over a DataFrame argument), not as a session temp view: two
    batches in one session (a kept Spark Connect session, a zombie attempt beside its successor) never read
    each other's rows. The wrapper stays on the query's first line, so Spark's line numbers are the query's.
    Braces are doubled because PySpark formats the statement for the argument."""
    query = statement(spec.query).replace("{", "{{").replace("}", "}}")
    return spark.sql(f"WITH {VIEW} AS (SELECT * FROM {{batch_rows}}) SELECT * FROM ({query}\n)", batch_rows=view)


def query_inputs(spark, spec: PipelineSpec) -> tuple[str, ...]:
    """The columns of `batch` the query reads, so that the staging tasks send Spark only those: the columns
    whose names the query's text never mentions are left out where that is sure, i.e. the query has no star
    for columns (count(*) aside) and no NATURAL join, and over a view without them it makes the same output.
    Else all. One column always stays, so that rows still carry their count."""
    names = tuple(view_struct(spec).names)
    text = statement(spec.query)
    if _STAR.search(_COUNT_STAR.sub("", text)) or _NATURAL.search(text):
        return names
    used = tuple(n for n in names if re.search(rf"(?<![\w$]){re.escape(n)}(?![\w$])", text, re.I)) or ("_partition",)
    if used == names:
        return names
    try:
        pruned = run_query(spark, _empty(spark, spec, used), spec).schema
    except Exception:  # a column the query needs after all: it reads them all
        return names
    return used if pruned == run_query(spark, _empty(spark, spec), spec).schema else names


def _empty(spark, spec: PipelineSpec, names: tuple[str, ...] | None = None):
    """An empty `batch` (of `names` only) for Spark to analyse the query over."""
    return spark.createDataFrame([], view_struct(spec, names))


def statement(query: str) -> str:
    """The query without what may follow it: whitespace, `;` and comments (which would end up inside the
    wrapper's parentheses). Quoted text and comments are skipped while scanning, so a `;` or `--` in them
    stays (pure)."""
    end = at = 0
    while at < len(query):
        c = query[at]
        if c in "'\"`":
            at += 1
            while at < len(query) and query[at] != c:
                at += 2 if query[at] == "\\" else 1
            at += 1
            end = at
        elif query.startswith("--", at):
            newline = query.find("\n", at)
            at = len(query) if newline < 0 else newline + 1
        elif query.startswith("/*", at):
            close = query.find("*/", at + 2)
            at = len(query) if close < 0 else close + 2
        else:
            at += 1
            if not (c.isspace() or c == ";"):
                end = at
    return query[:end]


def output_columns(spark, spec: PipelineSpec) -> tuple[Column, ...]:
    """Analyse the query over an empty `batch`: its output columns, checked against the target mode.
    Raises SpecError for SQL that does not parse or names what `batch` lacks; nothing is read."""
    try:
        schema = run_query(spark, _empty(spark, spec), spec).schema
    except Exception as exc:  # Spark's AnalysisException / ParseException, classic or Connect
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"pipeline {spec.name}: transform: the query does not run over `batch` "
                        f"(columns: {', '.join(view_columns(spec))}): {first}") from None
    inputs = {c.name: c for c in spec.stored_columns}
    columns = []
    for field in schema.fields:
        try:
            check_ident(field.name, "output column")
        except SpecError:
            raise SpecError(f"pipeline {spec.name}: transform: output column {field.name!r} needs a plain name "
                            f"(letters, digits, _): name it with AS") from None
        source = inputs.get(field.name)
        if source is not None and source.staged_as_text and field.dataType.simpleString() == "string":
            columns.append(source)  # a nested or binary column selected as it is keeps its type
            continue
        try:
            columns.append(parse_type(field.name, field.dataType.simpleString()))
        except SpecError as exc:
            raise SpecError(f"pipeline {spec.name}: transform: output column {field.name!r}: {exc} "
                            f"(cast it, or name it with AS)") from None
    check_output(spec, tuple(columns))
    return tuple(columns)


def view_columns(spec: PipelineSpec) -> list[str]:
    return [c.name for c in spec.stored_columns] + list(COORDINATE_NAMES)


def check_output(spec: PipelineSpec, columns: tuple[Column, ...]) -> None:
    names = [c.name for c in columns]
    where = f"pipeline {spec.name}: transform"
    if len(set(names)) != len(names):
        raise SpecError(f"{where}: the query's output names a column twice ({', '.join(names)})")
    for c in columns:
        if c.name.startswith("_") and c.name not in COORDINATE_NAMES + tuple(_METADATA_NAMES):
            raise SpecError(f"{where}: output column {c.name!r}: names starting with _ are reserved for lineage")
    missing_key = [k for k in spec.key if k not in names]
    if missing_key:
        raise SpecError(f"{where}: target.key column(s) {', '.join(missing_key)} are not in the query's output "
                        f"({', '.join(names)})")
    if spec.mode == "aggregate":
        _check_aggregate(spec, columns, where)
        return
    coordinates = [c for c in columns if c.name in COORDINATE_NAMES]
    if [c.name for c in coordinates] != list(COORDINATE_NAMES) or any(
            c.type != want for c, want in zip(coordinates, ("STRING", "INT", "BIGINT"))):
        raise SpecError(f"{where}: a {spec.mode} query keeps each row's source coordinates: select _topic, "
                        f"_partition and _offset unchanged (e.g. SELECT *, ... FROM batch WHERE ...); "
                        f"the output has {', '.join(names)}")


def _check_aggregate(spec: PipelineSpec, columns: tuple[Column, ...], where: str) -> None:
    measures = dict(spec.measures)
    by_name = {c.name: c for c in columns}
    for c in columns:
        if c.name.startswith("_"):
            raise SpecError(f"{where}: an aggregate query's output is groups: drop {c.name!r} or rename it")
        if c.name not in spec.key and c.name not in measures:
            raise SpecError(f"{where}: output column {c.name!r} is neither in target.key nor in target.measures "
                            f"({', '.join(f'{m}: {h}' for m, h in measures.items())})")
        if c.name in spec.key and c.is_json:
            raise SpecError(f"{where}: key column {c.name!r} is {c.spark_ddl}: keys must be scalars")
    for name, how in measures.items():
        if name not in by_name:
            raise SpecError(f"{where}: target.measures.{name} is not in the query's output ({', '.join(by_name)})")
        c = by_name[name]
        if how == "sum" and c.type not in _NUMERIC:
            raise SpecError(f"{where}: measure {name!r} is {c.spark_ddl}: sum needs a number")
        if how in MERGES and not c.is_scalar:
            raise SpecError(f"{where}: measure {name!r} is {c.spark_ddl}: {how} needs a scalar")


def batch_shape(spark, spec: PipelineSpec) -> BatchShape:
    """The shape of a batch staged now: a query pipeline's is its query's output, analysed over an empty
    `batch` before anything is read; a plain pipeline's is its spec's."""
    return BatchShape.of_output(spec, output_columns(spark, spec)) if spec.query is not None else BatchShape.of_spec(spec)
