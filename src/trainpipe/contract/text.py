"""How a value appears in the one line a user reads (an error, a warning, a record): a number as the
number it is, a URI without its credentials. Every message goes through these two, so no component
writes its own. Stdlib only: the training ranks' telemetry imports it."""

from __future__ import annotations

import re
from typing import Any

#: The userinfo of a URI as RFC 3986 reads it: everything up to the last ``@`` of the authority.
_RFC_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@")
#: ... and as SQLAlchemy reads a database URL, whose password may hold ``/``, ``?`` or ``#`` unescaped.
_DB_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@]*(?::[^@]*)?@")


def redact(uri: str) -> str:
    """``uri`` with its ``user:password@`` replaced by ``***@``.

    Only the authority's userinfo goes: an ``@`` in a path stays (``sqlite:////data/x@y/mlflow.db`` is a
    file). The URI is read as RFC 3986 reads it and as SQLAlchemy reads a database URL (a password with
    an unescaped ``/`` or ``#``), and the longer reading is hidden: a URI may show less than it could
    (``http://host:8080/a@b``), never a password.
    """
    cut = max((m.end() for m in (_RFC_USERINFO.match(uri), _DB_USERINFO.match(uri)) if m), default=0)
    return f"{uri[: uri.index('://') + 3]}***@{uri[cut:]}" if cut else uri


def plain(value: Any) -> Any:
    """A NumPy (or other array library's) scalar as the Python value it holds, anything else as it is:
    ``f"{plain(v)!r}"`` reads ``1``, never ``np.int64(1)``."""
    if type(value) in (str, bytes) or not hasattr(value, "item"):
        return value
    try:
        return value.item()
    except (TypeError, ValueError):  # an array of more than one element: not a scalar
        return value
