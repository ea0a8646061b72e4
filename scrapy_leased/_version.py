"""The version of scrapy_leased, in one place (read by the build as well)."""

__version__ = "0.1.0"
