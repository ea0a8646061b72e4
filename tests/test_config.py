"""Every LEASED_* setting is validated with an error naming the setting and the value."""

from __future__ import annotations

import pytest
from scrapy.settings import Settings

from scrapy_leased.frontier import Budget
from scrapy_leased.settings import Budgets, LeasedConfig, LeasedConfigError
from scrapy_leased.worker.dupefilter import KnownSeen


def config(**values) -> LeasedConfig:
    return LeasedConfig.from_settings(Settings(values))


def test_defaults():
    c = config()
    assert c.redis_url is None and c.crawl_id is None
    assert c.lease_seconds == 30 and c.renew_interval == 10
    assert c.max_attempts == 4 and c.seen_bucket_bits == 14 and not c.keep_alive
    assert c.seen_cache == 100_000
    assert c.fail_http_codes == frozenset()
    assert c.connect_timeout == 15 and c.prune_ms == 150_000  # 5 worker TTLs


def test_values_from_the_command_line_are_strings():
    c = config(LEASED_LEASE_SECONDS="2", LEASED_MAX_ATTEMPTS="3", LEASED_KEEP_ALIVE="True",
               LEASED_FAIL_HTTP_CODES="503,429")
    assert c.lease_seconds == 2 and c.max_attempts == 3 and c.keep_alive
    assert c.fail_http_codes == {503, 429}


@pytest.mark.parametrize("url", ["redis://h:6379/0", "rediss://u:p@h:6380/1", "unix:///tmp/r.sock"])
def test_redis_url_schemes(url):
    assert config(LEASED_REDIS_URL=url).redis_url == url


@pytest.mark.parametrize(("name", "value"), [
    ("LEASED_REDIS_URL", "http://example.com"),
    ("LEASED_REDIS_URL", "localhost:6379"),
    ("LEASED_CRAWL_ID", "has space"),
    ("LEASED_CRAWL_ID", "a{b}"),
    ("LEASED_LEASE_SECONDS", "0.5"),
    ("LEASED_LEASE_SECONDS", "soon"),
    ("LEASED_MAX_ATTEMPTS", "0"),
    ("LEASED_MAX_ATTEMPTS", "2.5"),
    ("LEASED_SWEEP_INTERVAL", "0"),
    ("LEASED_IDLE_POLL", "-1"),
    ("LEASED_SEEN_BUCKET_BITS", "17"),
    ("LEASED_SEEN_CACHE", "-1"),
    ("LEASED_SEEN_CACHE", "many"),
    ("LEASED_SEEN_TTL", "0.5"),
    ("LEASED_SEEN_TTL", "-1"),
    ("LEASED_PREFETCH", "-1"),
    ("LEASED_KEEP_ALIVE", "perhaps"),
    ("LEASED_FAIL_HTTP_CODES", "503,x"),
    ("LEASED_CONNECT_TIMEOUT", "-1"),
    ("LEASED_CONNECT_TIMEOUT", "later"),
    ("LEASED_UPSERT_URL", "http://example.com/db"),
    ("LEASED_UPSERT_URL", "mysql://h/db"),
    ("LEASED_UPSERT_URL", "sqlite://relative.db"),
    ("LEASED_UPSERT_URL", "sqlite:///"),
    ("LEASED_UPSERT_URL", 5432),
    ("LEASED_UPSERT_KEY", ["a", "a"]),
    ("LEASED_UPSERT_KEY", ["a b"]),
    ("LEASED_UPSERT_KEY", [1]),
    ("LEASED_UPSERT_PREFIX", "1abc"),
    ("LEASED_UPSERT_PREFIX", "has-dash"),
    ("LEASED_UPSERT_PREFIX", 'x"; DROP TABLE y; --'),
    ("LEASED_UPSERT_BATCH_SIZE", "0"),
    ("LEASED_UPSERT_BATCH_SIZE", "1.5"),
    ("LEASED_UPSERT_BATCH_SIZE", "many"),
    ("LEASED_UPSERT_ENABLED", "maybe"),
])
def test_bad_values_name_the_setting_and_the_value(name, value):
    with pytest.raises(LeasedConfigError) as err:
        config(**{name: value})
    assert name in str(err.value) and repr(value) in str(err.value)


def test_renew_interval_must_be_shorter_than_the_lease():
    with pytest.raises(LeasedConfigError, match="LEASED_RENEW_INTERVAL .* LEASED_LEASE_SECONDS"):
        config(LEASED_LEASE_SECONDS=5, LEASED_RENEW_INTERVAL=5)


@pytest.mark.parametrize(("values", "needle"), [
    ({"LEASED_RATE": "fast"}, "LEASED_RATE ('fast')"),
    ({"LEASED_RATE": "0/min"}, "LEASED_RATE ('0/min')"),
    ({"LEASED_RATE": "10/fortnight"}, "LEASED_RATE ('10/fortnight')"),
    ({"LEASED_RATE": "10/s", "LEASED_RATE_BURST": "0"}, "LEASED_RATE_BURST ('0')"),
    ({"LEASED_RATE_BURST": "many"}, "LEASED_RATE_BURST ('many')"),  # even with no rate
    ({"LEASED_RATES": {"a.com": {"rate": "1/s", "burst": 0}}}, "burst of LEASED_RATES['a.com']"),
    ({"LEASED_RATES": {"a.com": {"rate": "1/s", "speed": 2}}}, "LEASED_RATES['a.com']"),
    ({"LEASED_RATE_KEY": "ip"}, "LEASED_RATE_KEY ('ip')"),
    ({"LEASED_RATE_BACKOFF": "-1"}, "LEASED_RATE_BACKOFF ('-1')"),
    ({"LEASED_RATE_FREE_GRACE": "-0.1"}, "LEASED_RATE_FREE_GRACE ('-0.1')"),
    ({"LEASED_RATE_FREE_GRACE": "soon"}, "LEASED_RATE_FREE_GRACE ('soon')"),
])
def test_bad_rate_settings_name_the_setting_and_the_value(values, needle):
    with pytest.raises(LeasedConfigError) as err:
        Budgets.from_settings(Settings(values))
    assert needle in str(err.value)


def test_rates_are_rounded_to_never_exceed_and_most_specific_pattern_wins():
    b = Budgets.from_settings(Settings({
        "LEASED_RATE": "3/s", "LEASED_RATE_BURST": 2,
        "LEASED_RATES": {"a.example.com": "1/s", "*.example.com": {"rate": "30/min", "burst": 4}},
    }))
    assert b.default == Budget(334, 2)  # 3/s rounded up to 334 ms: never above 3/s
    assert b.for_lane("a.example.com") == Budget(1000, 2)
    assert b.for_lane("b.example.com") == b.for_lane("example.com") == Budget(2000, 4)
    assert b.for_lane("notexample.com") == Budget(334, 2)
    assert not Budgets.from_settings(Settings()).enabled


def test_known_seen_keeps_the_newest_entries_up_to_its_size():
    known = KnownSeen(3)
    for member in (1, -1, 2**63 - 1, -2**63):
        known.add(5, member)
    assert len(known) == 3
    assert (5, 1) not in known  # the oldest, forgotten
    assert (5, -1) in known and (5, 2**63 - 1) in known and (5, -2**63) in known
    assert (4, -1) not in known and (6, -1) not in known  # the bucket is part of the key
    known.add(5, -1)  # already known: nothing moves
    assert len(known) == 3 and (5, -1) in known
    known.clear()  # Redis went back in time: it may have forgotten them
    assert len(known) == 0 and (5, -1) not in known
    known.add(5, 7)
    assert (5, 7) in known
    off = KnownSeen(0)
    off.add(1, 1)
    assert len(off) == 0 and (1, 1) not in off


def test_config_for_reads_the_settings_once_per_crawler() -> None:
    from scrapy.utils.test import get_crawler

    from scrapy_leased.settings import config_for

    crawler = get_crawler(settings_dict={"LEASED_LEASE_SECONDS": 12})
    first = config_for(crawler)
    assert first.lease_seconds == 12
    assert config_for(crawler) is first  # every component shares it
    assert config_for(get_crawler(settings_dict={})) is not first  # one per crawler
