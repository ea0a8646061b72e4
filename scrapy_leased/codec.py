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

from __future__ import annotations

import base64
import datetime
import decimal
import importlib
import io
import json
import sys
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from itemadapter import ItemAdapter
from scrapy import Request, Spider
from scrapy.http.request import NO_CALLBACK
from scrapy.settings import BaseSettings

from .exceptions import LeasedConfigError
from .frontier.scripts import safe_text as safe_text  # what a message may carry into Redis
from .meta import PRIVATE_META_PREFIX, revisit_ms, shown

TAG = "$leased"
_DIRECT = ("method", "cookies", "meta", "encoding", "dont_filter", "flags", "cb_kwargs")
_DEFAULTS: dict[str, Any] = {
    "method": "GET", "cookies": {}, "meta": {}, "encoding": "utf-8",
    "dont_filter": False, "flags": [], "cb_kwargs": {},
}
_SHORT = {"method": "m", "cookies": "c", "meta": "k", "encoding": "e",
          "dont_filter": "f", "flags": "fl", "cb_kwargs": "kw"}
_LONG = {v: k for k, v in _SHORT.items()}
_PACKED = ("cookies", "meta", "flags", "cb_kwargs")  # may hold more than JSON
_HANDLED = {"url", "headers", "body", "priority", "callback", "errback", *_DIRECT}
_SIMPLE = (str, int, float, bool, type(None))
SUPPORTED = ("JSON types, bytes, datetime/date/time/timedelta, Decimal, UUID, tuples, sets, "
             "Requests, items of the project's classes, scrapy-playwright PageMethods and "
             "the classes of LEASED_META_TYPES")


#: The largest priority a stored request may have (and minus it the smallest): Redis's
#: Lua numbers are doubles, exact up to 2**53 (lua/lib_settle.lua: tier_code).
MAX_PRIORITY = 2**53 - 1
#: Where a field of a payload comes from, for messages (``meta['x']``).
_FIELD_NAMES = {"u": "url", "h": "headers", "b": "body", "cb": "callback", "eb": "errback",
                "x": "attribute", "cls": "class", "p": "priority", **_LONG}


def unencodable(value: Any, where: str = "") -> str | None:
    """Where in ``value`` (str, and lists, tuples and dicts of them, keys included) a
    str sits that UTF-8 cannot encode (a lone surrogate), as a path (``['meta']['x']``,
    ``where`` prefixed), or None when there is none."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return path or "the text"
        elif isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, str) and unencodable(k) is not None:
                    return f"{path}[{safe_text(repr(k))}] (the key)"
                stack.append((x, f"{path}[{safe_text(repr(k))}]"))
        elif isinstance(v, (list, tuple)):
            stack.extend((x, f"{path}[{i}]") for i, x in enumerate(v))
    return None


class PayloadError(ValueError):
    """A request cannot be stored, or a stored payload cannot be turned back. The
    message is safe to store and log (safe_text)."""

    def __init__(self, message: str) -> None:
        super().__init__(safe_text(str(message)))


class _Unstorable(Exception):
    """A value that cannot be stored; ``path`` is filled in while unwinding. ``detail``
    follows the value's type in the message, ``fix`` says what to do."""

    def __init__(self, value: Any, detail: str = "", fix: str = "") -> None:
        super().__init__(detail)
        self.value = value
        self.detail = detail
        self.fix = fix or (f"meta and cb_kwargs may hold {SUPPORTED}; to store objects "
                           "of another class, name it in LEASED_META_TYPES with an encoder "
                           "and a decoder (docs/plugins.md#objects-in-meta)")
        self.path: list[str] = []


def _where(path: Iterable[str]) -> str:
    return "".join(path)


@dataclass(frozen=True)
class MetaType:
    """A class whose objects may travel in meta and cb_kwargs (``LEASED_META_TYPES``):
    ``encode(obj)`` gives data the codec can store (JSON types and what else meta may
    hold, other registered objects included), ``decode(data)`` an object equal to
    ``obj``. ``load`` gives the class (imported when the setting names it; the
    built-in ones only from their fixed module, when a payload holds one)."""

    name: str  # "module:qualname", as payloads name it
    load: Callable[[], type]
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


def _page_method_class() -> type:
    module = sys.modules.get("scrapy_playwright.page") or importlib.import_module(
        "scrapy_playwright.page")
    cls: type = module.PageMethod
    return cls


def _encode_page_method(pm: Any) -> Any:
    if not isinstance(pm.method, str):
        raise _Unstorable(pm, f"whose method is {pm.method!r}, a callable",
                          "a worker cannot receive code: use a PageMethod with the name of "
                          "a Playwright Page method (PageMethod('evaluate', 'js code')), or "
                          "call the function in the callback with playwright_include_page")
    return {"m": pm.method, "a": list(pm.args), "kw": pm.kwargs}


def _decode_page_method(data: Any) -> Any:
    return _page_method_class()(data["m"], *data.get("a", ()), **data.get("kw", {}))


#: Built-in meta types, by payload name: found by their class's name when encoding (their
#: module is never imported to encode), imported from that fixed module to decode.
BUILTIN_TYPES: dict[str, MetaType] = {
    "scrapy_playwright.page:PageMethod": MetaType(
        "scrapy_playwright.page:PageMethod", _page_method_class, _encode_page_method,
        _decode_page_method),
}


def _import_object(path: str, setting: str) -> Any:
    module, sep, qual = path.partition(":")
    if not sep:
        module, _, qual = path.rpartition(".")
    if not module or not qual:
        raise LeasedConfigError(f"{setting}: {path!r} is not a dotted path to a class "
                                "(e.g. 'myproject.types.Money')")
    try:
        obj: Any = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        raise LeasedConfigError(f"{setting}: {path!r} cannot be imported: "
                                f"{type(exc).__name__}: {exc}") from None
    return obj


def _by_fields(cls: type) -> tuple[Callable[[Any], Any], Callable[[Any], Any]] | None:
    """Encoder and decoder of a dataclass or attrs class (its fields by name)."""
    import dataclasses

    if dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
    elif getattr(cls, "__attrs_attrs__", None) is not None:
        names = [a.name for a in cls.__attrs_attrs__]  # type: ignore[attr-defined]
    else:
        return None
    return ((lambda obj: {n: getattr(obj, n) for n in names}),
            (lambda data: _build_item(cls, data)))


def _to_dict(obj: Any) -> Any:
    return obj.to_dict()


def _constant(cls: type) -> Callable[[], type]:
    return lambda: cls


def meta_types(settings: BaseSettings | None) -> dict[str, MetaType]:
    """The built-in meta types and those of ``LEASED_META_TYPES``: a list of classes
    (dotted paths) that have ``to_dict()`` and a classmethod ``from_dict(data)``, or are
    dataclasses or attrs classes (stored field by field); or a dict of class -> codec,
    an object (a class, an instance, a module) with ``encode(obj)`` and
    ``decode(data)``. Imports what it names (and nothing else); raises
    LeasedConfigError naming the setting."""
    found = dict(BUILTIN_TYPES)
    raw = settings.get("LEASED_META_TYPES") if settings is not None else None
    if not raw:
        return found
    assert settings is not None
    for key, codec_path in _meta_types_setting(settings).items():
        meta_type = _meta_type(key, codec_path)
        if meta_type is not None:
            found[meta_type.name] = meta_type
    return found


def _meta_types_setting(settings: BaseSettings) -> Mapping[Any, Any]:
    """LEASED_META_TYPES as a mapping class -> codec (None: the class's own)."""
    setting = "LEASED_META_TYPES"
    raw = settings.get(setting)
    if isinstance(raw, str):
        text = raw.strip()
        try:
            raw = json.loads(text) if text.startswith(("{", "[")) else [
                p.strip() for p in text.split(",") if p.strip()]
        except ValueError:
            raw = None
    if isinstance(raw, (list, tuple)):
        raw = dict.fromkeys(raw)
    if not isinstance(raw, Mapping) or not all(
            isinstance(k, (str, type)) and (v is None or isinstance(v, str) or not isinstance(
                v, (int, float, bool, list, dict))) for k, v in raw.items()):
        raise LeasedConfigError(
            f"{setting} ({settings.get(setting)!r}) must be a list of classes, or a dict of "
            "class -> codec, as dotted paths: ['myproject.types.Money'] or "
            "{'myproject.types.Money': 'myproject.types.MoneyCodec'}")
    return raw


def _meta_type(key: Any, codec_path: Any) -> MetaType | None:
    """The MetaType of one entry of LEASED_META_TYPES (None: a built-in one)."""
    setting = "LEASED_META_TYPES"
    cls = key if isinstance(key, type) else _import_object(key, setting)
    if not isinstance(cls, type):
        raise LeasedConfigError(f"{setting}: {key!r} is not a class")
    name = f"{cls.__module__}:{cls.__qualname__}"
    if "<locals>" in name:
        raise LeasedConfigError(f"{setting}: {key!r} is defined inside a function: a "
                                "worker finds it by name, define it in a module")
    if codec_path is None and name in BUILTIN_TYPES:
        return None  # named although built in (scrapy_playwright.page.PageMethod)
    if codec_path is not None:
        codec = (_import_object(codec_path, setting) if isinstance(codec_path, str)
                 else codec_path)
        encode, decode = getattr(codec, "encode", None), getattr(codec, "decode", None)
        if not (callable(encode) and callable(decode)):
            raise LeasedConfigError(
                f"{setting}: the codec of {key!r} ({codec_path!r}) has no encode(obj) "
                "and decode(data) functions")
    elif callable(getattr(cls, "to_dict", None)) and callable(
            getattr(cls, "from_dict", None)):
        encode, decode = _to_dict, cls.from_dict  # type: ignore[attr-defined]
    else:
        fields = _by_fields(cls)
        if fields is None:
            raise LeasedConfigError(
                f"{setting}: {key!r} is neither a dataclass nor an attrs class and has "
                "no to_dict()/from_dict(data): name a codec for it, "
                f"{{{name.replace(':', '.')!r}: 'myproject.codecs.{cls.__name__}Codec'}}, "
                "an object with encode(obj) and decode(data)")
        encode, decode = fields
    return MetaType(name, _constant(cls), encode, decode)


def item_modules(settings: BaseSettings) -> list[str]:
    """``LEASED_ITEM_MODULES``: module names (a list, or comma-separated); raises
    LeasedConfigError."""
    extra = settings.get("LEASED_ITEM_MODULES") or []
    if isinstance(extra, str):
        extra = [m.strip() for m in extra.split(",")]
    if not isinstance(extra, (list, tuple)) or not all(
            isinstance(m, str) and m and all(p.isidentifier() for p in m.split("."))
            for m in extra):
        raise LeasedConfigError(
            f"LEASED_ITEM_MODULES ({settings.get('LEASED_ITEM_MODULES')!r}) must be a "
            "list of module names, e.g. ['myproject.items', 'shared_items'].")
    return list(extra)


def _poet_injected(value: Any) -> bool:
    """Whether a cb_kwargs value is one scrapy-poet injects (a page object, a web-poet
    page input), which it builds again for each download (never imports web_poet)."""
    web_poet = sys.modules.get("web_poet")
    if web_poet is None:
        return False
    injectable = getattr(web_poet, "Injectable", None)
    if isinstance(injectable, type) and isinstance(value, injectable):
        return True
    return type(value).__module__.startswith("web_poet.page_inputs")


def _refusal(value: Any) -> _Unstorable:
    """Why ``value`` (of no storable type) cannot be stored, with what to do instead."""
    module = type(value).__module__ or ""
    if module.split(".")[0] == "playwright":
        return _Unstorable(
            value, "a live Playwright object of this worker's browser",
            "it cannot cross workers (another worker may download the request): leave "
            "'playwright_page' out of the requests you yield and redo the page's steps with "
            "playwright_page_methods, or finish the work in the callback that got the page "
            "(playwright_include_page) and close it there")
    if isinstance(value, type):
        return _Unstorable(value, "a class", "store its name, or name the class in "
                           "LEASED_META_TYPES and store an object of it")
    if callable(value):
        return _Unstorable(
            value, "a callable", "a worker cannot receive code: store the name of a spider "
            "method (a str) and find it with getattr(self, name) in the callback "
            "(scrapy-playwright takes method names in playwright_page_event_handlers)")
    if isinstance(value, io.IOBase):
        return _Unstorable(value, "an open file", "it exists only in this process: store "
                           "its path and open it where it is used")
    return _Unstorable(value)


class ItemClasses:
    """The modules item classes named in a payload may come from, and the other classes
    a payload may name (``types``: meta_types; the built-in ones when not given)."""

    def __init__(self, modules: Iterable[str],
                 types: Mapping[str, MetaType] | None = None) -> None:
        self.modules = tuple(dict.fromkeys(m for m in modules if m))
        self.types: Mapping[str, MetaType] = BUILTIN_TYPES if types is None else types
        self._with: dict[type, ItemClasses] = {}

    @classmethod
    def from_settings(cls, settings: BaseSettings | None,
                      spider: Spider | None = None) -> ItemClasses:
        modules: list[str] = []
        if settings is not None:
            modules += [m.split(".")[0] for m in settings.getlist("SPIDER_MODULES")]
            modules += item_modules(settings)
        if spider is not None:
            modules.append(type(spider).__module__.split(".")[0])
        return cls(modules, meta_types(settings))

    def with_spider(self, spider: Spider | None) -> ItemClasses:
        """These modules and the spider's own package."""
        if spider is None:
            return self
        found = self._with.get(type(spider))
        if found is None:
            top = type(spider).__module__.split(".")[0]
            found = self if top in self.modules else ItemClasses((*self.modules, top),
                                                                 self.types)
            self._with[type(spider)] = found
        return found

    def meta_type(self, value: Any) -> MetaType | None:
        """The registered type of ``value`` (its exact class), or None."""
        cls = type(value)
        entry = self.types.get(f"{cls.__module__}:{cls.__qualname__}")
        if entry is None:
            return None
        try:
            if entry.load() is not cls:  # a namesake
                return None
        except Exception:
            return None
        return entry

    def meta_type_named(self, name: Any) -> MetaType:
        """The registered type a payload names; raises PayloadError for any other."""
        entry = self.types.get(name) if isinstance(name, str) else None
        if entry is None:
            raise PayloadError(f"class {name!r} is not one of LEASED_META_TYPES")
        return entry

    def allows(self, module: str) -> bool:
        return any(module == m or module.startswith(m + ".") for m in self.modules)

    def name_of(self, item: Any) -> str:
        """``module:qualname`` of an item's class, which payloads may name."""
        cls = type(item)
        module, qual = cls.__module__, cls.__qualname__
        if "<locals>" in qual:
            raise _Unstorable(item, "an item class defined inside a function",
                              "a worker finds item classes by name: define it in a module")
        if not self.allows(module):
            raise _Unstorable(item, "an item class outside the project's modules "
                              f"({', '.join(self.modules) or 'none'})",
                              f"add {module!r} to LEASED_ITEM_MODULES if it is yours")
        return f"{module}:{qual}"

    def resolve(self, name: Any) -> type:
        module, _, qual = str(name).partition(":")
        if not qual or not self.allows(module):
            raise PayloadError(f"class {name!r} is not in one of the project's modules "
                               f"({self._describe()})")
        try:
            obj: Any = sys.modules.get(module) or importlib.import_module(module)
            for part in qual.split("."):
                obj = getattr(obj, part)
        except Exception as exc:
            raise PayloadError(f"class {name!r} cannot be found: {type(exc).__name__}: {exc}") \
                from None
        if not (isinstance(obj, type) and ItemAdapter.is_item_class(obj)):
            raise PayloadError(f"{name!r} is not an item class")
        return obj

    def _describe(self) -> str:
        names = ", ".join(self.modules) or "none"
        return f"{names}; SPIDER_MODULES and LEASED_ITEM_MODULES add more"


#: (spider class, function) -> the name of the spider attribute holding it, for methods
#: whose ``__name__`` is not that attribute (found once per class and function)
_ATTR_NAMES: dict[tuple[type, Any], str | None] = {}


def _attribute_name(spider: Any, func: Callable[..., Any]) -> str | None:
    """The attribute of ``spider``'s class that holds the function of bound method
    ``func``, found by identity as Scrapy's ``request_to_dict`` does: a callback made by a
    decorator or a factory (scrapy-poet's ``parse_book = callback_for(BookPage)``, whose
    ``__name__`` is ``async_parse``) is stored under the name the spider gives it."""
    target = getattr(func, "__func__", None)
    if target is None:
        return None
    key = (type(spider), target)
    if key not in _ATTR_NAMES:
        found = None
        for cls in type(spider).__mro__:
            for attr, value in vars(cls).items():
                if value is target or getattr(value, "__func__", None) is target:
                    found = attr
                    break
            if found is not None:
                break
        _ATTR_NAMES[key] = found
    return _ATTR_NAMES[key]


def _callable_name(spider: Spider | None, func: Callable[..., Any] | None, what: str) -> Any:
    if func is None or func is NO_CALLBACK:
        return None if func is None else "NO_CALLBACK"
    owner = getattr(func, "__self__", None)
    name = getattr(func, "__name__", None)
    if spider is not None and owner is spider and name and getattr(spider, name, None) == func:
        return name
    if spider is not None and owner is spider:
        attr = _attribute_name(spider, func)
        if attr is not None and getattr(spider, attr, None) == func:
            return attr
    spider_name = getattr(spider, "name", None)
    raise PayloadError(
        f"{what} {func!r} is not a method of spider {spider_name!r}: scrapy_leased "
        "stores callbacks by the name of the spider attribute that holds them (as Scrapy's "
        "request_to_dict does), so use a spider method, or make the function one "
        "(parse_book = callback_for(BookPage) in the spider's class)"
    )


def _resolve(spider: Spider, name: str | None, what: str) -> Any:
    if name is None:
        return None
    if name == "NO_CALLBACK":
        return NO_CALLBACK
    try:
        return getattr(spider, name)
    except AttributeError:
        raise PayloadError(f"{what} {name!r} is not a method of spider {spider.name!r}") from None


def _request_class(path: str) -> type[Request]:
    # Never import a module because Redis said so: only classes of modules this
    # process already loaded (Scrapy's own, the project's spiders) are accepted.
    module, _, name = str(path).rpartition(".")
    cls = getattr(sys.modules.get(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, Request)):
        raise PayloadError(f"class {path!r} is not a loaded scrapy Request class")
    return cls


class Codec:
    def __init__(self, classes: ItemClasses | None = None) -> None:
        self.classes = classes or ItemClasses(())

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Codec:
        return cls(ItemClasses.from_settings(settings))

    # -- encode ----------------------------------------------------------------------

    def encode(self, request: Request, spider: Spider | None,
               names: tuple[str | None, str | None] | None = None) -> str:
        """Return the request as JSON; raise PayloadError naming what cannot be stored.
        ``names``: the callback's and errback's method names, for a request made without
        the spider (the feed: feed/format.py), instead of its own (which must be None)."""
        classes = self.classes.with_spider(spider)
        check_request(request)
        try:
            d = self._request_dict(request, spider, classes)
            if names is not None:
                for key, name in zip(("cb", "eb"), names):
                    if name is not None:
                        d[key] = name
            payload = json.dumps(d, separators=(",", ":"), ensure_ascii=False)
        except _Unstorable as exc:
            kind = type(exc.value)
            detail = f", {exc.detail}" if exc.detail else ""
            raise PayloadError(
                f"cannot store {request!r}: {_where(exc.path)} is a "
                f"{kind.__module__}.{kind.__qualname__}{detail}; {exc.fix}") from None
        except PayloadError as exc:  # a callback or errback
            raise PayloadError(f"cannot store {request!r}: {exc}") from None
        except RecursionError:
            raise PayloadError(f"cannot store {request!r}: its meta, cb_kwargs or "
                               "attributes are nested too deeply (or hold themselves)"
                               ) from None
        except ValueError as exc:  # an int of more digits than Python converts
            raise PayloadError(f"cannot store {request!r}: a value in its meta, cb_kwargs or "
                               f"attributes cannot be written as JSON ({exc})") from None
        if not payload.isascii():
            try:
                payload.encode("utf-8")
            except UnicodeEncodeError:
                where = unencodable({_FIELD_NAMES.get(k, k): v for k, v in d.items()})
                raise PayloadError(
                    f"cannot store {request!r}: {where} holds a lone surrogate (half of a "
                    "UTF-16 pair, e.g. a truncated emoji), which is not text Redis can "
                    "store (UTF-8): decode with errors='replace', or drop the value"
                    ) from None
        return payload

    def _request_dict(self, request: Request, spider: Spider | None,
                      classes: ItemClasses, nested: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {"u": request.url}
        if nested and request.priority:  # a queued request's priority is in its envelope
            d["p"] = request.priority
        for attr in _DIRECT:
            value = getattr(request, attr)
            if attr == "meta":
                value = {k: v for k, v in value.items()
                         if not (isinstance(k, str) and k.startswith(PRIVATE_META_PREFIX))}
            elif attr == "cb_kwargs" and value:
                value = {k: v for k, v in value.items() if not _poet_injected(v)}
            if value != _DEFAULTS[attr]:
                if attr in _PACKED:
                    try:
                        value = self._pack(value, classes, spider)
                    except _Unstorable as exc:
                        exc.path.insert(0, attr)
                        raise
                d[_SHORT[attr]] = value
        if request.headers:
            d["h"] = {k.decode("latin-1"): [v.decode("latin-1") for v in vs]
                      for k, vs in request.headers.items()}
        if request.body:
            d["b"] = base64.b64encode(request.body).decode("ascii")
        cb = _callable_name(spider, request.callback, "callback")
        if cb is not None:
            d["cb"] = cb
        eb = _callable_name(spider, request.errback, "errback")
        if eb is not None:
            d["eb"] = eb
        if type(request) is not Request:
            d["cls"] = f"{type(request).__module__}.{type(request).__qualname__}"
            extra = {a: getattr(request, a) for a in request.attributes if a not in _HANDLED}
            if extra:
                try:
                    d["x"] = self._pack(extra, classes, spider)
                except _Unstorable as exc:
                    exc.path.insert(0, "attribute")
                    raise
        return d

    def _pack(self, v: Any, classes: ItemClasses, spider: Spider | None) -> Any:
        t = type(v)
        if t in _SIMPLE:
            return v
        if t is list:
            if all(type(x) in _SIMPLE for x in v):
                return v
            out = []
            for i, x in enumerate(v):
                try:
                    out.append(self._pack(x, classes, spider))
                except _Unstorable as exc:
                    exc.path.insert(0, f"[{i}]")
                    raise
            return out
        if t is dict:
            if TAG not in v and all(type(k) is str for k in v):
                if all(type(x) in _SIMPLE for x in v.values()):
                    return v  # the usual meta: nothing to tag
                packed = {}
                for k, x in v.items():
                    try:
                        packed[k] = self._pack(x, classes, spider)
                    except _Unstorable as exc:
                        exc.path.insert(0, f"[{k!r}]")
                        raise
                return packed
            return {TAG: "dict", "v": self._pairs(v, classes, spider)}
        if t is tuple or t is set or t is frozenset:
            return {TAG: t.__name__, "v": self._pack(list(v), classes, spider)}
        if t is bytes or t is bytearray:
            return {TAG: t.__name__, "v": base64.b64encode(v).decode("ascii")}
        if t is datetime.datetime or t is datetime.date or t is datetime.time:
            return {TAG: t.__name__, "v": v.isoformat()}
        if t is datetime.timedelta:
            return {TAG: "timedelta", "v": [v.days, v.seconds, v.microseconds]}
        if t is decimal.Decimal:
            return {TAG: "decimal", "v": str(v)}
        if t is uuid.UUID:
            return {TAG: "uuid", "v": str(v)}
        if t is OrderedDict:
            return {TAG: "odict", "v": self._pairs(v, classes, spider)}
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            return v  # a str/int/float subclass (lxml's text results, enums): as JSON does
        return self._pack_object(v, classes, spider)

    def _pack_object(self, v: Any, classes: ItemClasses, spider: Spider | None) -> Any:
        """A request, an object of LEASED_META_TYPES or an item, tagged; else refused."""
        if isinstance(v, Request):
            try:
                return {TAG: "request", "v": self._request_dict(v, spider, classes, True)}
            except PayloadError as exc:
                raise _Unstorable(v, "", str(exc)) from None
        entry = classes.meta_type(v)
        if entry is not None:
            try:
                data = entry.encode(v)
            except _Unstorable:
                raise
            except Exception as exc:
                raise _Unstorable(v, f"whose encoder ({entry.name}) raised "
                                  f"{type(exc).__name__}: {exc}",
                                  "fix the encoder of LEASED_META_TYPES") from None
            return {TAG: "obj", "c": entry.name, "v": self._pack(data, classes, spider)}
        if ItemAdapter.is_item(v):
            name = classes.name_of(v)
            fields = {}
            for k, x in ItemAdapter(v).items():
                try:
                    fields[k] = self._pack(x, classes, spider)
                except _Unstorable as exc:
                    exc.path.insert(0, f"[{k!r}]")
                    raise
            return {TAG: "item", "c": name, "v": fields}
        raise _refusal(v)

    def _pairs(self, v: dict[Any, Any], classes: ItemClasses,
               spider: Spider | None) -> list[list[Any]]:
        out = []
        for k, x in v.items():
            try:
                out.append([self._pack(k, classes, spider), self._pack(x, classes, spider)])
            except _Unstorable as exc:
                exc.path.insert(0, f"[{k!r}]")
                raise
        return out

    # -- decode ----------------------------------------------------------------------

    def decode(self, payload: str, spider: Spider, priority: int = 0) -> Request:
        """Rebuild a request; raise PayloadError with the reason when impossible."""
        classes = self.classes.with_spider(spider)
        try:
            d = json.loads(payload)
            if not isinstance(d, dict) or not isinstance(d.get("u"), str):
                raise PayloadError("payload is not a JSON object with a 'u' (url) string")
            return self._request(d, spider, priority, classes, TAG in payload)
        except PayloadError:
            raise
        except Exception as exc:  # anything a hand-written or corrupted payload can cause
            raise PayloadError(f"undecodable payload: {type(exc).__name__}: {exc}") from None

    def _request(self, d: dict[str, Any], spider: Spider, priority: int,
                 classes: ItemClasses, tagged: bool) -> Request:
        if tagged:
            kwargs = {_LONG[k]: self._unpack(v, classes, spider, _LONG[k])
                      for k, v in d.items() if k in _LONG}
        else:
            kwargs = {_LONG[k]: v for k, v in d.items() if k in _LONG}
        if "h" in d:
            kwargs["headers"] = d["h"]
        if "b" in d:
            kwargs["body"] = base64.b64decode(d["b"], validate=True)
        kwargs["callback"] = _resolve(spider, d.get("cb"), "callback")
        kwargs["errback"] = _resolve(spider, d.get("eb"), "errback")
        cls = _request_class(d["cls"]) if "cls" in d else Request
        if "x" in d:
            kwargs.update(self._unpack(d["x"], classes, spider, "attribute") if tagged
                          else d["x"])
        if "p" in d:
            priority = d["p"]
        return cls(d["u"], priority=priority, **kwargs)

    def _unpack(self, v: Any, classes: ItemClasses, spider: Spider, where: str) -> Any:
        t = type(v)
        if t is list:
            return [self._unpack(x, classes, spider, where) for x in v]
        if t is not dict:
            return v
        tag = v.get(TAG)
        if tag is None:
            return {k: self._unpack(x, classes, spider, f"{where}[{k!r}]") for k, x in v.items()}
        x = v.get("v")
        try:
            if tag == "dict":
                return {self._unpack(a, classes, spider, where):
                        self._unpack(b, classes, spider, where)
                        for a, b in x}
            if tag == "odict":
                return OrderedDict((self._unpack(a, classes, spider, where),
                                    self._unpack(b, classes, spider, where)) for a, b in x)
            if tag in ("tuple", "set", "frozenset"):
                items = self._unpack(x, classes, spider, where)
                return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
            if tag == "bytes":
                return base64.b64decode(x, validate=True)
            if tag == "bytearray":
                return bytearray(base64.b64decode(x, validate=True))
            if tag == "datetime":
                return datetime.datetime.fromisoformat(x)
            if tag == "date":
                return datetime.date.fromisoformat(x)
            if tag == "time":
                return datetime.time.fromisoformat(x)
            if tag == "timedelta":
                return datetime.timedelta(days=x[0], seconds=x[1], microseconds=x[2])
            if tag == "decimal":
                return decimal.Decimal(x)
            if tag == "uuid":
                return uuid.UUID(x)
            if tag == "request":
                request = self._request(x, spider, 0, classes, True)
                return request
            if tag == "item":
                cls = classes.resolve(v.get("c"))
                fields = {k: self._unpack(f, classes, spider, f"{where}[{k!r}]")
                          for k, f in x.items()}
                return _build_item(cls, fields)
            if tag == "obj":
                entry = classes.meta_type_named(v.get("c"))
                return entry.decode(self._unpack(x, classes, spider, where))
        except PayloadError as exc:
            raise PayloadError(f"{where}: {exc}") from None
        except Exception as exc:
            raise PayloadError(f"{where}: bad {tag!r} value: {type(exc).__name__}: {exc}") \
                from None
        raise PayloadError(f"{where}: unknown tag {tag!r}")


def _build_item(cls: type, fields: dict[str, Any]) -> Any:
    """An item of ``cls`` with these field values (those its constructor does not take
    are set afterwards: dataclass and attrs fields with ``init=False``)."""
    import dataclasses

    if dataclasses.is_dataclass(cls):
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        item = cls(**{k: v for k, v in fields.items() if k in init})
        for k, v in fields.items():
            if k not in init:
                object.__setattr__(item, k, v)
        return item
    attrs_fields = getattr(cls, "__attrs_attrs__", None)
    if attrs_fields is not None:
        by_name = {a.name: a for a in attrs_fields}
        kwargs = {}
        late = {}
        for k, v in fields.items():
            a = by_name.get(k)
            if a is not None and a.init:
                kwargs[getattr(a, "alias", None) or k.lstrip("_")] = v
            else:
                late[k] = v
        item = cls(**kwargs)
        for k, v in late.items():
            object.__setattr__(item, k, v)
        return item
    if issubclass(cls, dict):
        mapping = cls()
        mapping.update(fields)
        return mapping
    return cls(**fields)  # scrapy.Item, pydantic


def check_request(request: Request) -> None:
    """Raise PayloadError when what is sent beside a request's payload cannot be stored:
    a priority that is not an integer (bool included: redis-py refuses it) within
    ``MAX_PRIORITY``, a ``leased_revisit_after`` that is not a number of seconds
    (meta.revisit_ms)."""
    priority = request.priority
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise PayloadError(f"cannot store {request!r}: its priority ({shown(priority)}) is "
                           "not an integer")
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise PayloadError(f"cannot store {request!r}: its priority ({shown(priority)}) is "
                           f"out of range: at most {MAX_PRIORITY} either way (2**53 - 1, "
                           "as far as Redis's Lua numbers are exact)")
    try:
        revisit_ms(request, 0)
    except ValueError as exc:
        raise PayloadError(f"cannot store {request!r}: {exc}") from None


_default = Codec()


def encode_request(request: Request, spider: Spider | None,
                   classes: ItemClasses | None = None) -> str:
    """Return the request as JSON (see Codec.encode)."""
    return (Codec(classes) if classes is not None else _default).encode(request, spider)


def decode_request(payload: str, spider: Spider, priority: int = 0,
                   classes: ItemClasses | None = None) -> Request:
    """Rebuild a request (see Codec.decode)."""
    return (Codec(classes) if classes is not None else _default).decode(payload, spider, priority)
