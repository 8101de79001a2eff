"""Spark SQL settings every session ledgerbatch makes or attaches to carries (spark/session.py, spark/connect.py)."""

# A transform's SQL reads its batch, never a file named in it (text.`/etc/passwd`): docs/transforms.md
NO_FILE_RELATIONS = ("spark.sql.runSQLOnFiles", "false")
