"""Reaching Redis: URLs (``url``), clients (``client``, ``sentinel``, ``cluster``),
connecting and checking a server (``connection``), reads across nodes (``scan``), and the
embedded server a project runs when no URL is set (``embedded``, ``watchdog``).

Imports nothing else of scrapy_leased: every other layer builds on it."""
