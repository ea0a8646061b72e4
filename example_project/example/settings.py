"""Settings of the example project: a plain Scrapy project plus one add-on line.

Every worker started here (`scrapy crawl pages -a site=URL`) joins the same crawl
(`pages`, the spider's name). Without LEASED_REDIS_URL they share an embedded Redis
in `.scrapy/leased-redis/` that the first worker starts.
"""

BOT_NAME = "example"

SPIDER_MODULES = ["example.spiders"]
NEWSPIDER_MODULE = "example.spiders"

ADDONS = {"scrapy_leased.Addon": 100}
# LEASED_REDIS_URL = "redis://127.0.0.1:6379/0"  # unset: the embedded Redis

# Be an honest crawler: say who you are, honour robots.txt (the demo gives
# each worker its own User-Agent, so the test site's log tells them apart).
USER_AGENT = "scrapy-leased-example/1.0 (+https://github.com/scrapy-leased)"
ROBOTSTXT_OBEY = True

CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 16
DOWNLOAD_DELAY = 0
LOG_LEVEL = "INFO"
TELNETCONSOLE_ENABLED = False

# The fleet as a whole never sends more than this to one host (127.0.0.1, 127.0.0.2,
# ... are different hosts); bursts of 10 requests are fine.
LEASED_RATE = "100/s"
LEASED_RATE_BURST = 10

# A 500 after Scrapy's own retries is a failure: attempt +1, requeued, dead letter
# after LEASED_MAX_ATTEMPTS (4). See them with `scrapy leased dead`.
LEASED_FAIL_HTTP_CODES = [500]

# The fleet line in each worker's log (scrapy_leased.observe.logstats), every 10 s here.
LEASED_LOGSTATS_INTERVAL = 10
