class RecoverableError(Exception):
    pass


class RecoverMiddleware:
    """Spider middleware that turns a RecoverableError from a callback into an item:
    the exception is handled, so the request counts as processed."""

    def process_spider_exception(self, response, exception):
        if isinstance(exception, RecoverableError):
            return [{"url": response.url, "recovered": True}]
        return None
