"""Which client settings carry a secret, and their values as they may be stored, hashed or shown.

A spec may hold the credentials of a registry of its own (`source.schema_registry`: `basic.auth.user.info`,
`bearer.auth.token`, or a `url` with user-info). They reach the client, never the ledger: the spec text
pinned in `ledger.spec_versions` (readable by the inspector role) and the spec's version hash see
REDACTED instead, so rotating a password makes no new spec version.
"""
from __future__ import annotations

import re

REDACTED = "<redacted>"
# librdkafka and the registry client name their secrets so: sasl.password, ssl.key.password,
# ssl.key.pem, sasl.oauthbearer.client.secret, basic.auth.user.info, bearer.auth.token, ...
_SECRET_KEY = re.compile(r"password|secret|token|user\.info|userinfo|\.key\.pem$|\.key$|apikey|api\.key",
                         re.I)
# scheme://user:password@host (or user@host): the authority's part before its LAST @ (a password may hold
# an @; the registry client, like urllib, splits the user-info off there)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]+)@")


def is_secret(key: str) -> bool:
    return bool(_SECRET_KEY.search(str(key)))


def without_userinfo(text: str) -> str:
    """`text` with the user-info of every URL in it replaced: https://u:pw@host -> https://<redacted>@host."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", str(text))


def redacted(settings: dict) -> dict:
    """Client settings as they may be stored or shown: secret values REDACTED, URLs without user-info."""
    return {k: REDACTED if is_secret(k) else without_userinfo(v) if isinstance(v, str) else v
            for k, v in settings.items()}
