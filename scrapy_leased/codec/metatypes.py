"""``LEASED_META_TYPES``: the classes a project trusts to travel in meta and cb_kwargs,
each with its encoder and decoder, and the built-in scrapy-playwright ``PageMethod``."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scrapy.settings import BaseSettings

from ..exceptions import LeasedConfigError
from .items import build_item
from .refusal import Unstorable


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
        raise Unstorable(pm, f"whose method is {pm.method!r}, a callable",
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
            (lambda data: build_item(cls, data)))


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
