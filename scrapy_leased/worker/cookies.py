"""Cookies shared by the fleet: ``LeasedCookiesMiddleware`` replaces Scrapy's
CookiesMiddleware (at its order, 700; addon.py) and keeps its semantics (one CookieJar
per ``meta['cookiejar']``, ``Request.cookies`` merged into the jar, ``dont_merge_cookies``,
COOKIES_DEBUG), but each jar is also in Redis (keys.py: ``cookie_jar``), so a cookie a
response set on one worker (a login's session) is sent by every worker of the crawl.

- Each jar is one HASH: field ``<domain>\\n<path>\\n<name>`` -> the cookie as JSON (never
  pickle), field ``v`` its version. A worker's changes to a jar (the cookies a response
  set or deleted, those a request's ``cookies`` added) are written by one Lua call
  (lua/cookies_set.lua: checked, then written; expired cookies pruned by Redis time; the
  version raised) before the response goes on to the callback: the requests the
  callback yields, whichever worker claims them, are sent with the cookie.
- Reads: every write also sets a mark in the crawl's control HASH (``cookies``), and
  every claim returns that mark (lua/claim.lua). A request is sent with the jar as it is
  in this worker when the jar was read (an ``HGET`` of its version) at the mark of this
  worker's last claim, which came after the claim of the request: no jar changed since,
  so the cookies any earlier response set are in it. Otherwise one ``HGET`` of the
  version, and the jar is loaded again (``HGETALL``) only when the version moved. A
  crawl whose responses set no cookie reads no jar. A worker's own writes do not make
  it load again unless another worker wrote in between.
- Redis failing: a request is sent with the jar this worker has (a WARNING, once per
  outage); changes not written stay pending in the worker (sent with its requests) and
  are written with the jar's next change, or retried at most once a second with its
  next requests. The crawl never ends for a cookie.
- With ``LEASED_SHARED_COOKIES = False`` (or another SCHEDULER) the jars are the
  worker's own, as with Scrapy's middleware; then, with the add-on's scheduler, the
  first Set-Cookie logs one WARNING saying that sessions are per worker.
- A ``meta['cookiejar']`` that is not JSON (a str, int, float, bool, None or a tuple of
  them) cannot be named in Redis: its jar stays per worker (a WARNING once per key).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable
from http.cookiejar import Cookie
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy.downloadermiddlewares.cookies import CookiesMiddleware
from scrapy.exceptions import NotConfigured
from scrapy.http.cookies import CookieJar
from scrapy.utils.python import to_unicode

from ..frontier.scripts import Scripts, as_str
from ..runtime import worker_of
from ..settings import config_for

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

    from ..frontier.keys import CrawlKeys

logger = logging.getLogger(__name__)

#: worker/lua/cookies_set.lua: the fleet's cookie jars
SCRIPTS = Scripts("scrapy_leased.worker", {"cookies_set": ("lib_keys",)})
VERSION_FIELD = "v"  # the jar's version, in its HASH (lua/cookies_set.lua)
#: A ``meta['cookiejar']`` whose JSON is longer is named by its SHA-1 in Redis.
MAX_JAR_NAME = 200
RETRY_SECONDS = 1.0  # pending changes of a jar are retried at most this often
_ATTRS = ("version", "name", "value", "port", "port_specified", "domain", "domain_specified",
          "domain_initial_dot", "path", "path_specified", "secure", "expires", "discard",
          "comment", "comment_url")


def jar_name(key: Any) -> str | None:
    """The name of the jar ``meta['cookiejar'] = key`` in Redis: its JSON (``null`` the
    default jar), a SHA-1 when long; None when ``key`` has no JSON that tells it apart
    (then its jar is per worker)."""
    if key is not None and not isinstance(key, (str, int, float, tuple)):
        return None
    try:
        text = json.dumps(key, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return None
    if isinstance(key, tuple) and json.loads(text) != list(key):
        return None  # something in it is not plain JSON
    if len(text) > MAX_JAR_NAME:
        text = "sha1:" + hashlib.sha1(text.encode()).hexdigest()
    return text


def cookie_field(cookie: Cookie) -> str:
    return f"{cookie.domain}\n{cookie.path}\n{cookie.name}"


def cookie_to_json(cookie: Cookie) -> str:
    doc: dict[str, Any] = {a: getattr(cookie, a) for a in _ATTRS}
    doc["rest"] = dict(getattr(cookie, "_rest", {}))
    doc["rfc2109"] = cookie.rfc2109
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def cookie_from_json(text: str | bytes) -> Cookie:
    """The cookie stored by ``cookie_to_json``; ValueError (or TypeError, KeyError) when
    it is not one."""
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    for attr in ("name", "domain", "path"):
        if not isinstance(doc.get(attr), str):
            raise ValueError(f"{attr} is not a string")
    expires = doc.get("expires")
    if expires is not None and not isinstance(expires, (int, float)):
        raise ValueError("expires is not a number")
    rest = doc.get("rest") or {}
    if not isinstance(rest, dict):
        raise ValueError("rest is not an object")
    return Cookie(
        doc.get("version", 0), doc["name"], doc.get("value"), doc.get("port"),
        bool(doc.get("port_specified")), doc["domain"], bool(doc.get("domain_specified")),
        bool(doc.get("domain_initial_dot")), doc["path"], bool(doc.get("path_specified")),
        bool(doc.get("secure")), None if expires is None else int(expires),
        bool(doc.get("discard")), doc.get("comment"), doc.get("comment_url"), rest,
        rfc2109=bool(doc.get("rfc2109")))


def snapshot(jar: CookieJar) -> dict[str, str]:
    """field -> JSON of every cookie in ``jar``."""
    return {cookie_field(c): cookie_to_json(c) for c in jar}


class SharedJar:
    """This worker's view of one jar in Redis."""

    def __init__(self, key: str) -> None:
        self.key = key  # the HASH
        self.version: int | None = None  # the version the local jar reflects (None: not loaded)
        #: the claims' cookie mark (Frontier.cookies_mark) when the version was last read
        self.read_at: str | None = None
        #: changes not written yet: field -> cookie JSON, or None to delete
        self.pending: dict[str, str | None] = {}
        self.loading: asyncio.Future[None] | None = None
        self.writing = False
        self.retry_at = 0.0  # time.monotonic() before which pending changes wait


@dataclasses.dataclass(eq=False)
class CookieStore:
    """The crawl's cookie jars in Redis (one frontier's client and keys)."""

    client: Any
    keys: CrawlKeys
    stats: Any
    #: the cookie mark of this worker's last claim (Frontier.cookies_mark), None: unknown
    mark: Callable[[], str | None] = lambda: None
    shared: dict[str, SharedJar] = dataclasses.field(default_factory=dict)
    _warned: set[str] = dataclasses.field(default_factory=set)

    def __post_init__(self) -> None:
        self.script = SCRIPTS.register(self.client, "cookies_set")["cookies_set"]

    def _warn_once(self, kind: str, msg: str, args: dict[str, Any]) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning(msg, args)

    def _ok(self, kind: str) -> None:
        self._warned.discard(kind)

    def of(self, name: str) -> SharedJar:
        shared = self.shared.get(name)
        if shared is None:
            shared = self.shared[name] = SharedJar(self.keys.cookie_jar(name))
        return shared

    async def sync(self, shared: SharedJar, jar: CookieJar) -> None:
        """Bring ``jar`` up to the fleet's version of it (one HGET; an HGETALL when it
        moved), none when the last claim's cookie mark is the one it was read at; on a
        Redis error, ``jar`` stays as it is."""
        mark = self.mark()
        if mark is not None and mark == shared.read_at and shared.loading is None:
            return
        if await self._joined_load(shared):
            return
        try:
            raw = await self.client.hget(shared.key, VERSION_FIELD)
        except (RedisError, OSError) as exc:
            self._warn_once("read", "Shared cookies unavailable (%(exc)s): requests are "
                            "sent with this worker's cookies until Redis answers",
                            {"exc": exc})
            return
        self._ok("read")
        self.stats.inc_value("leased/cookies_checked")
        version = int(raw) if raw is not None else 0
        if version == shared.version or (shared.version is None and version == 0):
            shared.version = version
            shared.read_at = mark
            return
        if await self._joined_load(shared):  # another request started loading meanwhile
            return
        loading = shared.loading = asyncio.get_running_loop().create_future()
        try:
            if await self._load(shared, jar):
                shared.read_at = mark
        finally:
            loading.set_result(None)
            shared.loading = None

    @staticmethod
    async def _joined_load(shared: SharedJar) -> bool:
        """Wait for the load of the jar in progress, if any; whether there was one."""
        if shared.loading is None:
            return False
        await asyncio.shield(shared.loading)
        return True

    async def _load(self, shared: SharedJar, jar: CookieJar) -> bool:
        """Load ``jar`` from Redis; whether it could be read."""
        try:
            data = await self.client.hgetall(shared.key)
        except (RedisError, OSError) as exc:
            self._warn_once("read", "Shared cookies unavailable (%(exc)s): requests are "
                            "sent with this worker's cookies until Redis answers",
                            {"exc": exc})
            return False
        cookies: list[Cookie] = []
        version = 0
        now = time.time()
        for field, text in data.items():
            name = as_str(field)
            if name == VERSION_FIELD:
                try:
                    version = int(text)
                except ValueError:
                    version = -1  # not a version this module wrote: loaded again next time
                continue
            try:
                cookie = cookie_from_json(text)
            except (ValueError, TypeError, KeyError) as exc:
                logger.debug("Skipped an unreadable cookie %(f)r of %(key)s: %(exc)s",
                             {"f": name, "key": shared.key, "exc": exc})
                continue
            if not cookie.is_expired(int(now)):
                cookies.append(cookie)
        inner = jar.jar
        inner.clear()
        for cookie in cookies:
            inner.set_cookie(cookie)
        # this worker's changes not written yet stay in its jar
        for field, text in shared.pending.items():
            if text is None:
                domain, path, name = field.split("\n", 2)
                try:
                    inner.clear(domain, path, name)
                except KeyError:
                    pass
            else:
                inner.set_cookie(cookie_from_json(text))
        shared.version = version
        self.stats.inc_value("leased/cookies_loaded")
        return True

    def note_changes(self, shared: SharedJar, before: dict[str, str], jar: CookieJar) -> bool:
        """Add what changed in ``jar`` since ``before`` (``snapshot``) to the pending
        changes; whether there are any."""
        after = snapshot(jar)
        for field, text in after.items():
            if before.get(field) != text:
                shared.pending[field] = text
        for field in before.keys() - after.keys():
            shared.pending[field] = None
        return bool(shared.pending)

    async def write(self, shared: SharedJar, *, retry: bool = False) -> None:
        """Write the jar's pending changes (lua/cookies_set.lua); on a Redis error they
        stay pending, retried after RETRY_SECONDS. ``retry``: only if that time came."""
        if not shared.pending or shared.writing:
            return
        if retry and time.monotonic() < shared.retry_at:
            return
        changes = dict(shared.pending)
        sets = [(f, t) for f, t in changes.items() if t is not None]
        dels = [f for f, t in changes.items() if t is None]
        args: list[Any] = [len(sets)]
        for field, text in sets:
            args += [field, text]
        args += dels
        shared.writing = True
        try:
            reply = await self.script(keys=[shared.key, self.keys.control], args=args)
        except (RedisError, OSError) as exc:
            shared.retry_at = time.monotonic() + RETRY_SECONDS
            self.stats.inc_value("leased/cookies_write_errors")
            self._warn_once("write", "Could not share cookies (%(exc)s): this worker sends "
                            "them and writes them to Redis once it answers", {"exc": exc})
            return
        finally:
            shared.writing = False
        self._ok("write")
        for field, change in changes.items():
            if field in shared.pending and shared.pending[field] == change:  # not changed since
                del shared.pending[field]
        version = int(reply[0])
        if shared.version is not None and version == shared.version + 1:
            shared.version = version  # no other writer in between: the jar is current
        self.stats.inc_value("leased/cookies_written", len(changes))


class LeasedCookiesMiddleware(CookiesMiddleware):
    """Scrapy's CookiesMiddleware with the jars shared by the fleet in Redis (see the
    module's docstring)."""

    def __init__(self, debug: bool = False, shared: bool = True) -> None:
        super().__init__(debug)
        self.shared = shared
        self._store: CookieStore | None = None
        self._store_frontier: Any = None
        self._warned_local = False
        self._warned_keys: set[str] = set()
        #: meta['cookiejar'] -> its shared jar of ``_store`` (None: kept per worker)
        self._jar_of: dict[Any, SharedJar | None] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        if not crawler.settings.getbool("COOKIES_ENABLED"):
            raise NotConfigured
        config = config_for(crawler)
        o = cls(crawler.settings.getbool("COOKIES_DEBUG"), shared=config.shared_cookies)
        o.crawler = crawler
        return o

    def _cookie_store(self) -> CookieStore | None:
        """The crawl's shared jars; None when the jars are per worker (opted out, or no
        leased scheduler)."""
        if not self.shared:
            return None
        scheduler = worker_of(self.crawler)
        frontier = None if scheduler is None else scheduler.frontier
        if frontier is None:
            return None
        if self._store is None or self._store_frontier is not frontier:
            self._store = CookieStore(frontier.client, frontier.keys, self.crawler.stats,
                                      lambda: frontier.cookies_mark)
            self._store_frontier = frontier
            self._jar_of = {}
        return self._store

    def _shared_jar(self, store: CookieStore | None, key: Any) -> SharedJar | None:
        if store is None:
            return None
        try:
            return self._jar_of[key]
        except KeyError:
            pass
        shared = self._jar_of[key] = self._new_shared_jar(store, key)
        return shared

    def _new_shared_jar(self, store: CookieStore, key: Any) -> SharedJar | None:
        name = jar_name(key)
        if name is None:
            kind = repr(key)
            if kind not in self._warned_keys:
                self._warned_keys.add(kind)
                logger.warning("meta['cookiejar'] %(key)s is not a str, int, float, None or "
                               "a tuple of them: its cookies stay in this worker",
                               {"key": kind[:200]})
            return None
        return store.of(name)

    async def process_request(  # type: ignore[override]
            self, request: Request, spider: Spider | None = None) -> None:
        if request.meta.get("dont_merge_cookies", False):
            return None
        key = request.meta.get("cookiejar")
        store = self._cookie_store()
        shared = self._shared_jar(store, key)
        jar = self.jars[key]
        if store is not None and shared is not None:
            await store.sync(shared, jar)
            if shared.pending:
                await store.write(shared, retry=True)
        before = snapshot(jar) if shared is not None and request.cookies else None
        cookies = self._get_request_cookies(jar, request)
        self._process_cookies(cookies, jar=jar, request=request)
        if store is not None and shared is not None and before is not None \
                and store.note_changes(shared, before, jar):
            await store.write(shared)
        request.headers.pop("Cookie", None)
        jar.add_cookie_header(request)
        self._log_sent(request)
        return None

    async def process_response(  # type: ignore[override]
            self, request: Request, response: Response,
            spider: Spider | None = None) -> Response:
        if request.meta.get("dont_merge_cookies", False):
            return response
        key = request.meta.get("cookiejar")
        jar = self.jars[key]
        set_cookie = bool(response.headers.getlist("Set-Cookie"))
        store = self._cookie_store()
        shared = self._shared_jar(store, key) if set_cookie else None
        before = snapshot(jar) if shared is not None else None
        cookies = jar.make_cookies(response, request)
        self._process_cookies(cookies, jar=jar, request=request)
        self._log_received(response)
        if store is not None and shared is not None and before is not None:
            if store.note_changes(shared, before, jar):
                await store.write(shared)
        elif set_cookie and not self._warned_local and not self.shared \
                and worker_of(self.crawler) is not None:
            self._warned_local = True
            logger.warning(
                "%(response)s set a cookie: with LEASED_SHARED_COOKIES = False sessions are "
                "per worker (requests another worker claims are sent without this "
                "worker's cookies); remove the setting to share them across the fleet",
                {"response": response}, extra={"spider": self.crawler.spider})
        return response

    # COOKIES_DEBUG, as Scrapy's middleware logs it
    def _log_sent(self, request: Request) -> None:
        if self.debug:
            cl = [to_unicode(c, errors="replace") for c in request.headers.getlist("Cookie")]
            if cl:
                cookies = "\n".join(f"Cookie: {c}\n" for c in cl)
                logger.debug("Sending cookies to: %s\n%s", request, cookies,
                             extra={"spider": self.crawler.spider})

    def _log_received(self, response: Response) -> None:
        if self.debug:
            cl = [to_unicode(c, errors="replace")
                  for c in response.headers.getlist("Set-Cookie")]
            if cl:
                cookies = "\n".join(f"Set-Cookie: {c}\n" for c in cl)
                logger.debug("Received cookies from: %s\n%s", response, cookies,
                             extra={"spider": self.crawler.spider})
