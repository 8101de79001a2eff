"""What a spec's Spark SQL (a transform query or a per-column expression) may not do: reach outside the
batch. Spark runs it in the driver and the executors, whose processes hold the deployment's settings, so

- reflection (`java_method`, `reflect`, `try_reflect`) would call any static Java method there
  (`System.getenv`: the database URL with its password);
- a script transform (`SELECT TRANSFORM(...) USING 'cmd'`, also `MAP`/`REDUCE ... USING`) runs a shell command;
- a file relation (``text.`/path` ``) reads local files: refused here, and off in every session ledgerbatch
  starts (`spark.sql.runSQLOnFiles=false`, spark/session.py);
- `IDENTIFIER('...')` would build any of those names from a string;
- a variable (`${env:X}` reads the environment, `${hivevar:x}` is empty and splits a name: `ref${hivevar:x}lect`)
  is replaced by Spark before it parses the text, so after this check: `${` is refused anywhere in the text,
  and substitution is off in every session (`spark.sql.variable.substitute=false`, spark/sql_settings.py).

The text is checked with comments removed, quoted names unquoted and string literals blanked, so neither
case, quotes (`` `reflect` ``), qualification (`system.builtin.reflect`) nor comments hide a name; a hint
(`/*+ ... */`) is code, not a comment: Spark parses what it holds.
"""
from __future__ import annotations

import re

from ledgerbatch.errors import SpecError

_REFUSED = (  # (pattern, over the text with quoted names unquoted?, why)
    (re.compile(r"(?i)(?<![\w$])(java_method|reflect|try_reflect)(?![\w$])"), True,
     "calls Java by reflection, which could read the environment (the database password) or run code"),
    (re.compile(r"(?i)(?<![\w$])using\s*r?'"), True,
     "is a script transform (USING 'command'), which runs a shell command"),
    (re.compile(r"(?i)(?<![\w$])identifier\s*\("), True,
     "builds a name from a string (IDENTIFIER), which hides what it calls"),
    (re.compile(r"(?i)(?<![\w$])\w+\s*\.\s*`[^`]*[/:\\][^`]*`"), False,
     "reads a file (a relation such as text.`/path`)"),
)


def check_sql(text: str, where: str) -> None:
    """SpecError naming `where` and what the SQL would reach, if it reaches outside the batch."""
    if "${" in text:  # in a literal or a comment too: substitution comes before any parsing
        raise SpecError(f"{where}: '${{' is a variable Spark would replace before parsing the text (${{env:...}} reads "
                        f"the environment); a transform may read only its batch "
                        f"(docs/transforms.md#what-a-transform-can-read)")
    for pattern, unquote, why in _REFUSED:
        found = pattern.search(_plain(text, unquote))
        if found:
            raise SpecError(f"{where}: {found.group(0).strip()!r} {why}; a transform may read only its batch "
                            f"(docs/transforms.md#what-a-transform-can-read)")


def _plain(text: str, unquote: bool) -> str:
    """Comments dropped, string literals blanked to '', quoted names unquoted (or kept as they are)."""
    kept = {"code": lambda part: part, "string": lambda part: "''", "comment": lambda part: " ",
            "name": (lambda part: part[1:-1]) if unquote else (lambda part: part)}
    return "".join(kept[kind](part) for kind, part in _tokens(text))


def _tokens(text: str):
    """(kind, text) pieces: code, string ('...' or "...", raw r'...' without escapes), name (`...`) and comment
    (-- to the end of the line, which Spark's lexer ends at a CR too, or /* */)."""
    at, start = 0, 0
    while at < len(text):
        c = text[at]
        if c in "'\"`" or text.startswith("--", at) or (text.startswith("/*", at) and not text.startswith("/*+", at)):
            if start < at:
                yield "code", text[start:at]
            if c in "'\"`":
                raw = c != "`" and _raw_prefix(text, at)
                end = at + 1
                while end < len(text) and text[end] != c:
                    end += 2 if text[end] == "\\" and c != "`" and not raw else 1
                end = min(end + 1, len(text))
                yield ("name" if c == "`" else "string"), text[at:end]
            elif text.startswith("--", at):
                line_end = re.compile(r"[\r\n]").search(text, at)
                end = len(text) if line_end is None else line_end.end()
                yield "comment", text[at:end]
            else:
                close = text.find("*/", at + 2)
                end = len(text) if close < 0 else close + 2
                yield "comment", text[at:end]
            at = start = end
        else:
            at += 1
    if start < len(text):
        yield "code", text[start:]


def _raw_prefix(text: str, quote_at: int) -> bool:
    """A raw string literal (r'...', R"..."): its backslashes escape nothing."""
    return (quote_at >= 1 and text[quote_at - 1] in "rR"
            and (quote_at == 1 or not (text[quote_at - 2].isalnum() or text[quote_at - 2] in "_$")))
