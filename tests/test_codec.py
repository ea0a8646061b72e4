"""Requests round-trip through JSON (never pickle); what cannot be stored is refused
with a reason, and what cannot be decoded raises PayloadError."""

from __future__ import annotations

import json

import pytest
import scrapy
from scrapy.http import FormRequest, JsonRequest

from scrapy_leased.codec import PayloadError, decode_request, encode_request


class S(scrapy.Spider):
    name = "s"

    def parse_page(self, response):
        pass

    def on_error(self, failure):
        pass


SPIDER = S()


def roundtrip(request: scrapy.Request) -> scrapy.Request:
    return decode_request(encode_request(request, SPIDER), SPIDER, request.priority)


def test_plain_get_is_little_more_than_its_url():
    payload = encode_request(scrapy.Request("http://example.com/a"), SPIDER)
    assert payload == '{"u":"http://example.com/a"}'


def test_every_field_round_trips():
    r = scrapy.Request("http://example.com/b?q=1", method="POST", body=b"\x00\xffbin",
                       headers={"X-A": ["1", "2"]}, cookies={"c": "v"},
                       meta={"depth": 2, "k": [1, "x"], "_leased_claim": 7}, encoding="latin-1",
                       priority=-3, dont_filter=True, flags=["f"], cb_kwargs={"n": 1},
                       callback=SPIDER.parse_page, errback=SPIDER.on_error)
    back = roundtrip(r)
    assert type(back) is scrapy.Request
    assert (back.url, back.method, back.body, back.encoding, back.priority, back.dont_filter,
            back.flags, back.cb_kwargs) == (r.url, "POST", b"\x00\xffbin", "latin-1", -3, True,
                                            ["f"], {"n": 1})
    assert back.headers.getlist("X-A") == [b"1", b"2"]
    assert back.cookies == {"c": "v"}
    assert back.meta == {"depth": 2, "k": [1, "x"]}  # the claim token is never stored
    assert back.callback == SPIDER.parse_page and back.errback == SPIDER.on_error


def test_request_subclasses_round_trip():
    back = roundtrip(JsonRequest("http://example.com/j", data={"a": 1}))
    assert type(back) is JsonRequest and json.loads(back.body) == {"a": 1}
    back = roundtrip(FormRequest("http://example.com/f", formdata={"a": "1"}))
    assert type(back) is FormRequest and back.body == b"a=1"


def test_callbacks_must_be_spider_methods():
    with pytest.raises(PayloadError, match="not a method of spider 's'"):
        encode_request(scrapy.Request("http://e.com", callback=lambda r: None), SPIDER)


def test_meta_must_be_json():
    with pytest.raises(PayloadError, match="JSON"):
        encode_request(scrapy.Request("http://e.com", meta={"obj": object()}), SPIDER)


@pytest.mark.parametrize("payload", [
    "{not json", "[]", '{"x": 1}', '{"u": "http://e.com", "cb": "missing"}',
    '{"u": "http://e.com", "cls": "os.system"}', '{"u": "http://e.com", "cls": "never.imported.Req"}',
    '{"u": "http://e.com", "b": "%%%"}',
])
def test_undecodable_payloads_raise_payload_error(payload):
    with pytest.raises(PayloadError):
        decode_request(payload, SPIDER)
