import scrapy


class LoginSpider(scrapy.Spider):
    """Logs in to the login site (tests/support/login_site.py) from start() with a
    FormRequest, then follows its pages, one item per page: ``url``, ``user`` (the user
    the page says is logged in, "" when none), ``logged_in``, ``session`` (the user it
    logged in as) and ``worker``.

    Spider args: ``start_url`` (the site's ``/login`` URL), ``users``: comma-separated
    users to log in as (default ``alice``); with ``jars=1`` each gets its own
    ``meta['cookiejar']`` (its name) and its pages carry ``?u=<user>`` (distinct URLs);
    ``worker``: copied into every item."""

    name = "login"

    def __init__(self, start_url=None, users="alice", jars="0", worker=None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not start_url:
            raise ValueError("spider 'login' needs -a start_url=<site>/login")
        self.login_url = start_url
        self.users = [u for u in users.split(",") if u]
        self.jars = jars == "1"
        self.worker = worker

    def _meta(self, user):
        return {"cookiejar": user} if self.jars else {}

    async def start(self):
        for user in self.users:
            yield scrapy.FormRequest(self.login_url, formdata={"user": user, "password": "pw"},
                                     callback=self.after_login, cb_kwargs={"session": user},
                                     meta=self._meta(user), dont_filter=True)

    def after_login(self, response, session):
        if f"welcome {session}" not in response.text:
            raise RuntimeError(f"login as {session} failed: {response.text[:100]}")
        query = f"?u={session}" if self.jars else ""
        yield response.follow(f"/p/0{query}", callback=self.parse, meta=self._meta(session),
                              cb_kwargs={"session": session})

    def parse(self, response, session):
        user = response.css("#user::text").get() or ""
        yield {"url": response.url, "user": user, "logged_in": bool(user),
               "session": session, "worker": self.worker}
        for href in response.css("a.next::attr(href)").getall():
            yield response.follow(href, callback=self.parse, meta=self._meta(session),
                                  cb_kwargs={"session": session})
