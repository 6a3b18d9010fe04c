from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from p2pcrawl.crawl.politeness import (
    HostPoliteness,
    next_gap,
    retry_after_seconds,
)
from p2pcrawl.settings import PolitenessSettings

SETTINGS = PolitenessSettings(delay=1.0, politeness_factor=5.0, max_delay=60.0)
NOW_EPOCH = 1_700_000_000.0


def http_date(epoch: float) -> str:
    return format_datetime(datetime.fromtimestamp(epoch, tz=UTC), usegmt=True)


def test_gap_is_our_minimum_delay_for_a_fast_polite_host() -> None:
    assert next_gap(SETTINGS, None, 0.05) == 1.0


def test_gap_follows_a_longer_crawl_delay_from_the_request_s_start() -> None:
    # The next request starts 4 s after the last one started: one per Crawl-delay.
    assert next_gap(SETTINGS, 4.0, 0.05) == pytest.approx(3.95)


def test_a_slow_answer_does_not_slow_a_crawl_delay_host_down() -> None:
    # No delay or factor of ours: a 50 ms Crawl-delay gives 20 requests a second whether
    # the answer took 3 ms or 30 (a loaded peer reads it late), and never two at once.
    settings = PolitenessSettings(delay=0.0, politeness_factor=0.0)
    for response in (0.003, 0.03):
        assert response + next_gap(settings, 0.05, response) == pytest.approx(0.05)
    assert next_gap(settings, 0.05, 0.2) == 0.0


def test_gap_is_a_multiple_of_a_slow_response() -> None:
    # Mercator: wait a multiple of the last response time.
    assert next_gap(SETTINGS, 2.0, 3.0) == 15.0


def test_gap_is_capped() -> None:
    assert next_gap(SETTINGS, 3600.0, 0.0) == SETTINGS.max_delay
    assert next_gap(SETTINGS, None, 100.0) == SETTINGS.max_delay


def test_gap_ignores_negative_inputs() -> None:
    settings = PolitenessSettings(delay=0.0)
    assert next_gap(settings, None, -5.0) == 0.0


def test_retry_after_delta_seconds() -> None:
    assert retry_after_seconds("120", NOW_EPOCH, 60.0, 600.0) == 120.0
    assert retry_after_seconds("  0 ", NOW_EPOCH, 60.0, 600.0) == 0.0


def test_retry_after_http_date() -> None:
    value = http_date(NOW_EPOCH + 90)
    assert retry_after_seconds(value, NOW_EPOCH, 60.0, 600.0) == pytest.approx(90.0)


@pytest.mark.parametrize(
    "value",
    ["Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"],
)
def test_retry_after_obsolete_date_forms(value: str) -> None:
    # RFC 9110 §5.6.7: rfc850 and asctime dates must be accepted too.
    now = datetime(1994, 11, 6, 8, 48, 37, tzinfo=UTC).timestamp()
    assert retry_after_seconds(value, now, 60.0, 600.0) == pytest.approx(60.0)


def test_retry_after_date_in_the_past_means_now() -> None:
    assert retry_after_seconds(http_date(NOW_EPOCH - 3600), NOW_EPOCH, 60.0, 600.0) == 0.0


@pytest.mark.parametrize("value", [None, "", "soon", "-5", "1.5", "12abc", "٣"])
def test_retry_after_garbage_gives_the_default(value: str | None) -> None:
    assert retry_after_seconds(value, NOW_EPOCH, 42.0, 600.0) == 42.0


def test_retry_after_is_capped() -> None:
    assert retry_after_seconds("99999999999999999999", NOW_EPOCH, 60.0, 600.0) == 600.0
    assert retry_after_seconds(http_date(NOW_EPOCH + 86400), NOW_EPOCH, 60.0, 600.0) == 600.0
    assert retry_after_seconds(None, NOW_EPOCH, 6000.0, 600.0) == 600.0


def test_fresh_host_is_ready() -> None:
    assert HostPoliteness().ready(0.0)


def test_busy_host_is_not_ready_and_cannot_start_twice() -> None:
    host = HostPoliteness()
    host.start(0.0)
    assert host.busy
    assert not host.ready(1000.0)
    with pytest.raises(RuntimeError):
        host.start(1000.0)


def test_finish_without_start_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        HostPoliteness().finish(0.0, 0.1, SETTINGS)


def test_finish_sets_next_allowed_from_the_gap() -> None:
    host = HostPoliteness(robots_delay=2.0)
    host.start(10.0)
    host.finish(10.5, 0.5, SETTINGS)
    assert not host.busy
    assert host.last_response_time == 0.5
    assert host.next_allowed == 10.5 + 2.5
    assert not host.ready(12.9)
    assert host.ready(13.0)


def test_finish_honours_a_longer_retry_after() -> None:
    host = HostPoliteness()
    host.start(0.0)
    host.finish(1.0, 0.1, SETTINGS, retry_after=30.0)
    assert host.next_allowed == 31.0
    host.start(31.0)
    host.finish(32.0, 0.1, SETTINGS, retry_after=0.0)
    assert host.next_allowed == 33.0


def test_consecutive_errors_back_off_and_success_resets() -> None:
    host = HostPoliteness()
    ends = []
    now = 0.0
    for _ in range(4):
        host.start(now)
        host.finish(now, 0.0, SETTINGS, error=True)
        ends.append(host.next_allowed - now)
        now = host.next_allowed
    assert host.consecutive_errors == 4
    assert ends == [1.0, 2.0, 4.0, 8.0]
    host.start(now)
    host.finish(now, 0.0, SETTINGS)
    assert host.consecutive_errors == 0
    assert host.next_allowed - now == 1.0
