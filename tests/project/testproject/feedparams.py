"""A project's own FEED_URI_PARAMS function (tests/test_feeds_fleet.py): the add-on's
``%(worker)s`` is set before it runs, so it sees it and may use it."""


def params(params, spider):
    params["tag"] = f"tagged-{params['worker'][:3]}"
    return params
