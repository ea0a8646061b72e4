"""Requests as compact tagged JSON: never pickle, callbacks and errbacks by name.

Only non-default fields are written, under short names, so a plain GET costs little
more than its URL. ``Request.to_dict`` is not used on the hot path: it finds a
callback's name with ``inspect.getmembers(spider)`` for every request.

``meta``, ``cb_kwargs`` (and cookies, flags, a Request subclass's extra attributes) may
hold what Scrapy projects put there, and get it back equal: JSON types as themselves,
and as a tagged object ``{"$leased": <tag>, "v": ...}``: ``bytes``, ``bytearray``,
``datetime``/``date``/``time``/``timedelta``, ``Decimal``, ``UUID``, tuples, sets and
frozensets, dicts whose keys are not all strings (or that hold the key ``$leased``
themselves), nested ``Request`` objects, and items of any class itemadapter supports
(``scrapy.Item``, dataclass, attrs, pydantic) when the class lives in one of the
project's modules: the top-level packages of ``SPIDER_MODULES`` and of the spider's own
module, and the modules named in ``LEASED_ITEM_MODULES`` (with their submodules). A
payload read from Redis can name nothing else: a class outside those modules, or one
that itemadapter does not take for an item class, is refused, so data in Redis cannot
make a worker import or call anything else. What cannot be stored raises PayloadError
naming the request and where the value sits (``meta['item']['when']``).

Other classes a project trusts are named in ``LEASED_META_TYPES`` (meta_types), each with
an explicit encoder and decoder: a payload names such a class only by the name the
setting gave it, and only classes named there (and the built-in scrapy-playwright
``PageMethod``) are rebuilt. What cannot cross workers (a live ``playwright_page``, a
callable, an open file) is refused with what to do instead. scrapy-poet's injected
callback arguments (page objects, web-poet inputs) are left out of a stored request's
``cb_kwargs``: scrapy-poet builds them again for the next download.

What the codec accepts can be sent to Redis as it is: a request whose text holds a lone
surrogate (``"\\ud83d"``, half of an emoji: a str Python holds and UTF-8 cannot encode,
which redis-py refuses with a UnicodeEncodeError), a priority that is not an integer
within ``MAX_PRIORITY`` (Redis's Lua numbers are doubles), a ``leased_revisit_after``
that is not a number of seconds (meta.revisit_ms), or a value nested too deeply raises
PayloadError here, before anything is sent, so that one request is refused alone.
"""

from .classes import ItemClasses
from .items import item_modules
from .metatypes import MetaType, meta_types
from .refusal import PayloadError, unencodable
from .request import MAX_PRIORITY, Codec, check_request, decode_request, encode_request

__all__ = ["MAX_PRIORITY", "Codec", "ItemClasses", "MetaType", "PayloadError", "check_request",
           "decode_request", "encode_request", "item_modules", "meta_types", "unencodable"]
