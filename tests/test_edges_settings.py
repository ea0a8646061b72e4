"""Every ``LEASED_*`` setting, given a hostile value, is one clear error naming it at
start, or a value the plugin works with (#24: one rule for every unit of input; a
setting is checked at start, not found out mid-crawl). Hypothesis draws the values:
NaN, infinities, numbers too large for a double or for Redis, negatives, surrogates,
wrong types. No Redis is needed: ``LeasedConfig.from_settings`` only reads settings."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scrapy.settings import Settings

from scrapy_leased.settings import LeasedConfig, LeasedConfigError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "settings.md"
NAMES = sorted(set(re.findall(r"^### (LEASED_[A-Z_]+)", DOCS.read_text(), re.M)))
#: Settings whose value is a URL or a path: any string is taken and checked when used
#: (connecting, opening a file), not here
NOT_NUMBERS = {"LEASED_REDIS_URL", "LEASED_UPSERT_URL", "LEASED_EMBEDDED_DIR",
               "LEASED_EMBEDDED_SERVER"}

hostile = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 1e306, 1e308, -1, -1e-9, 0, 2**64,
                     10**400, "nan", "inf", "-inf", "1e400", "9" * 400, "\ud83d", "",
                     " ", "1/0s", "9" * 400 + "/s", "1/" + "9" * 400 + "s", "0/s",
                     "nan/s", True, [], {}, {"rate": "nan/s"}, ["\ud83d"], [10**400],
                     ["nan"], "999999999999999999999"]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=12),
)


def _config(values: dict[str, Any]) -> LeasedConfig:
    s = Settings()
    s.set("LEASED_REDIS_URL", "redis://127.0.0.1:1")  # never connected to here
    for name, value in values.items():
        s.set(name, value)
    return LeasedConfig.from_settings(s)


def test_the_settings_reference_is_found() -> None:
    assert len(NAMES) > 30, NAMES


@settings(max_examples=600, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from([n for n in NAMES if n not in NOT_NUMBERS]), value=hostile)
def test_a_hostile_setting_is_one_error_naming_it(name: str, value: Any) -> None:
    try:
        config = _config({name: value})
    except LeasedConfigError as exc:
        assert name in str(exc), (name, value, str(exc))
        return
    # accepted: every number the worker derives from it is finite and fits Redis/Lua
    for field in ("lease_ms", "seen_ttl_ms", "prune_ms"):
        v = getattr(config, field, None)
        if v is not None:
            assert isinstance(v, int) and abs(v) <= 2**53, (name, value, field, v)
    for field, v in vars(config).items():
        if isinstance(v, float):
            assert math.isfinite(v), (name, value, field, v)
        if isinstance(v, int) and not isinstance(v, bool):
            assert abs(v) <= 2**53, (name, value, field, v)
