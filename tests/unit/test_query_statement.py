"""transform.statement: a query transform ends where its last token ends, so the wrapper that binds `batch`
(transform.run_query) can close its parentheses after it."""
from __future__ import annotations

import pytest

from ledgerbatch.stage.transform import statement


@pytest.mark.parametrize("query, want", [
    ("SELECT * FROM batch", "SELECT * FROM batch"),
    ("SELECT * FROM batch;", "SELECT * FROM batch"),
    ("SELECT * FROM batch; -- done\n", "SELECT * FROM batch"),
    ("SELECT * FROM batch ;; /* end */  \n\n", "SELECT * FROM batch"),
    ("SELECT * FROM batch -- a comment, no newline", "SELECT * FROM batch"),
    ("SELECT 'a; -- b' AS s FROM batch", "SELECT 'a; -- b' AS s FROM batch"),
    ("SELECT 'it''s;' AS s FROM batch;", "SELECT 'it''s;' AS s FROM batch"),
    ("SELECT 'a\\'; --' AS s FROM batch", "SELECT 'a\\'; --' AS s FROM batch"),
    ("SELECT `x;--` FROM batch -- c", "SELECT `x;--` FROM batch"),
    ("SELECT /* ; */ x -- mid\nFROM batch WHERE y = \"--\"; ", "SELECT /* ; */ x -- mid\nFROM batch WHERE y = \"--\""),
])
def test_what_follows_the_last_token_is_dropped(query, want):
    assert statement(query) == want
