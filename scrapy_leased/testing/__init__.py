"""A local website for tests, demos and benchmarks (as Scrapy's ``scrapy.utils.testsite``).

Standard library only, and nothing of scrapy_leased: :mod:`.site` serves it (in-process,
or ``python -m scrapy_leased.testing.site``), :mod:`.process` runs it as a subprocess,
:mod:`.pages` is the shape of its pages and :mod:`.latency` the per-page delays of its
latency profiles.
"""
