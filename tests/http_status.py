"""The HTTP status of a GET, for tests that check who a server answers (the driver's /progress, a
Ray head's dashboard): a refusal is a status to assert, not an exception."""

from __future__ import annotations

import urllib.error
import urllib.request


def http_status(url: str, authorization: str | None = None, *, timeout: float = 30) -> int:
    """The status of a GET of `url`, with the Authorization header if given."""
    request = urllib.request.Request(url)
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
