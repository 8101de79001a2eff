"""A batch's shape: the columns its rows have, decided once per batch and read by staging and the commit.

It is built from the spec for a plain pipeline (`of_spec`), from the query's analysed output for a query
pipeline (`of_output`: stage/transform.py's output_columns) and from the ledger's record of that output
(`recorded`: ledger.batches.output_schema) wherever a staged batch is read again: its commit, a dry run's
diff, `verify --deep`, lineage. So the commit publishes exactly the shape that was staged, and nothing
derives a column list from the spec on its own (staging DDL, the COPY's columns and its binary/CSV choice,
reconcile, publish, diff all read this).
"""
from __future__ import annotations

from dataclasses import dataclass

from ledgerbatch.errors import SpecError
from ledgerbatch.formats.schema import (
    BATCH_ID,
    COORDINATE_NAMES,
    LINEAGE,
    Column,
    binary_encodable,
    parse_schema,
    schema_ddl,
)
from ledgerbatch.identifiers import quote_ident

CHANGE_TYPE = "text"  # a change pipeline's `_change` column ('u', 'd' or 's')


@dataclass(frozen=True)
class BatchShape:
    """`columns`: the target's columns before lineage, in order. `changes`: staged rows are changes and carry
    `_change`. `groups`: rows are groups (mode aggregate): no coordinates, the batch id is their only
    lineage. `output_schema`: a query's output as Spark analysed it, as the ledger records it (None: a
    plain pipeline's shape is its spec's). The builders take a PipelineSpec (not imported: model/ sits
    below spec/)."""
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()
    version: str | None = None
    changes: bool = False
    groups: bool = False
    output_schema: str | None = None

    @classmethod
    def of_spec(cls, spec) -> BatchShape:
        """A plain pipeline's: the schema's columns, then the metadata it asks for."""
        return cls(spec.stored_columns, spec.key, spec.version_by, spec.changes, spec.mode == "aggregate")

    @classmethod
    def of_output(cls, spec, output: tuple[Column, ...]) -> BatchShape:
        """A query pipeline's: the query's output, whose coordinates are lineage."""
        columns = tuple(c for c in output if c.name not in COORDINATE_NAMES)
        return cls(columns, spec.key, spec.version_by, spec.changes, spec.mode == "aggregate", schema_ddl(output))

    @classmethod
    def recorded(cls, spec, output_schema: str | None) -> BatchShape:
        """The shape a staged batch was staged in, from what its ledger row recorded."""
        if spec.query is None:
            return cls.of_spec(spec)
        if not output_schema:
            raise SpecError(f"pipeline {spec.name}: the batch was staged without a query's output columns (before "
                            f"the spec had transform: as a query?): run it again to stage it with the query")
        return cls.of_output(spec, parse_schema(output_schema, lineage_names=True))

    @property
    def names(self) -> tuple[str, ...]:
        """The target's column names before lineage, in order."""
        return tuple(c.name for c in self.columns)

    @property
    def column_defs(self) -> str:
        """The columns as DDL (`"name" type`, one a line), names validated and quoted."""
        return ",\n    ".join(f"{quote_ident(c.name)} {c.pg_type}" for c in self.columns)

    @property
    def staged_names(self) -> tuple[str, ...]:
        """The staged good rows' columns before lineage: the target's, and what a change does."""
        return self.names + (("_change",) if self.changes else ())

    @property
    def coordinates(self) -> tuple[str, ...]:
        """The source coordinates each row carries (none for groups)."""
        return () if self.groups else COORDINATE_NAMES

    @property
    def lineage(self) -> tuple[Column, ...]:
        """The lineage columns the target keeps beside the columns."""
        return (BATCH_ID,) if self.groups else LINEAGE

    @property
    def output_order(self) -> tuple[str, ...]:
        """A query's output columns in the order its COPY takes them."""
        return self.names + self.coordinates

    @property
    def copy_types(self) -> tuple[str, ...]:
        """The PostgreSQL types of the good rows' (or the query output's) COPY columns, lineage included."""
        return (tuple(c.pg_type for c in self.columns) + ((CHANGE_TYPE,) if self.changes else ())
                + tuple(c.pg_type for c in self.lineage))

    @property
    def binary_types(self) -> tuple[str, ...]:
        """copy_types where the binary COPY can encode every one of them (the COPY is then binary), else ()."""
        types = self.copy_types
        return types if all(binary_encodable(t) for t in types) else ()
