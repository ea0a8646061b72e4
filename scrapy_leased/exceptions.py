"""Errors of scrapy_leased that more than one layer raises."""

from __future__ import annotations


class LeasedConfigError(ValueError):
    """A ``LEASED_*`` setting has a bad value; the message names it."""
