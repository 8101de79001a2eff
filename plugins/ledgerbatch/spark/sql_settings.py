"""Spark settings every session ledgerbatch makes or attaches to carries (spark/session.py, spark/connect.py,
spark/server.py)."""

# A transform's SQL reads its batch, never a file named in it (text.`/etc/passwd`): docs/transforms.md
NO_FILE_RELATIONS = ("spark.sql.runSQLOnFiles", "false")

# Nor a variable: with substitution on, Spark replaces ${env:X} (the process's environment), ${system:X} and
# ${hivevar:X} (empty when unset, so `ref${hivevar:x}lect` spells a refused name) in the text before parsing it,
# after spec/sql_rights.py checked it. spec/sql_rights.py refuses `${` too.
NO_VARIABLE_SUBSTITUTION = ("spark.sql.variable.substitute", "false")

# The UI has no login: it may show, never stop, a job.
NO_KILL_LINKS = ("spark.ui.killEnabled", "false")

# A driver of a local master needs no other host: its RPC and block manager on loopback. Only for local
# masters: a cluster's executors must reach the driver.
LOCAL_DRIVER = (("spark.driver.bindAddress", "127.0.0.1"), ("spark.driver.host", "127.0.0.1"))
