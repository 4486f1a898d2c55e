"""What an endpoint would answer for an error raised below it: an ApiError as it is, a domain
error (server/errors.py) through the one mapping the apps use (api/errors.py)."""
from __future__ import annotations

import pytest

from stackd.api.errors import answer_of
from stackd.errors import DomainError
from stackd.http.errors import ApiError

ANSWERED = (ApiError, DomainError)


class raises_http:
    """pytest.raises for refusals: `.value` is the ApiError the client would get."""

    value: ApiError

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None:
            pytest.fail("nothing was refused")
        if not isinstance(error, ANSWERED):
            return False
        self.value = answer_of(error)
        return True
