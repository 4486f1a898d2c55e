"""The Date header's own formatter writes what email.utils.formatdate(usegmt=True) does (the
daemon no longer imports the email package for it)."""
import email.utils
import random

from stackd.http.server import _http_date


def test_http_date_matches_email_utils_on_every_weekday_and_month():
    rng = random.Random(7)
    moments = [0, 951782400, 4107542399, 1_700_000_000.999]     # 1970, 29 Feb 2000, 2100
    moments += [rng.uniform(0, 4_102_444_800) for _ in range(2000)]
    for seconds in moments:
        assert _http_date(seconds) == email.utils.formatdate(seconds, usegmt=True).encode()


def test_http_date_without_an_argument_is_now():
    assert _http_date()[-4:] == b" GMT"
    assert email.utils.parsedate_to_datetime(_http_date().decode()).year >= 2024
