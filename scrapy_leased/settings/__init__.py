"""The settings layer: the defaults of every ``LEASED_*`` setting as data
(``defaults``), the rules they are checked by (``validate``), the rate budgets
(``rate``) and the ``UpsertPipeline`` settings (``upsert``), and ``LeasedConfig``
(``config``), which reads them all once per crawl.

Imports only the layers below it (``_redis``, ``frontier``, the codec); the rate
limiter, the pipeline, the feed, the fleet commands and the worker import it."""

from __future__ import annotations

from ..exceptions import LeasedConfigError
from .config import LeasedConfig, config_for
from .rate import Budgets
from .upsert import UpsertConfig
from .validate import (
    CRAWL_ID_RE,
    MAX_SETTING_NUMBER,
    REDIS_SCHEMES,
    bool_setting,
    check_crawl_id,
    check_redis_url,
    close_limits,
    in_scrapyd_job,
    logstats_interval,
    ms_setting,
    number_setting,
    parse_rate,
    run_grace,
)

__all__ = [
    "CRAWL_ID_RE", "MAX_SETTING_NUMBER", "REDIS_SCHEMES", "Budgets", "LeasedConfig",
    "LeasedConfigError", "UpsertConfig", "bool_setting", "check_crawl_id", "check_redis_url",
    "close_limits", "config_for", "in_scrapyd_job", "logstats_interval", "ms_setting",
    "number_setting", "parse_rate", "run_grace",
]
