"""Compact fingerprints for the fleet-wide seen set.

A fingerprint (20 bytes, SHA-1 from ``crawler.request_fingerprinter``) is split into a
bucket number (its top ``bits`` bits) and a signed 64-bit integer (the next 8 bytes).
Each bucket is a Redis SET of integers, which Redis keeps in its compact ``intset``
encoding (8 bytes per member) while it has at most ``set-max-intset-entries`` (512)
members: 2**14 buckets stay compact up to about 6 million URLs. 78 to 80 bits of the
fingerprint are kept, so a false "seen" needs about 10**12 URLs.
"""

from __future__ import annotations


def split_fingerprint(fp: bytes, bits: int) -> tuple[int, int]:
    """Return (bucket, member) for a fingerprint of at least 10 bytes."""
    if len(fp) < 10:
        raise ValueError(f"fingerprint too short ({len(fp)} bytes, need 10)")
    bucket = int.from_bytes(fp[:2], "big") >> (16 - bits) if bits else 0
    member = int.from_bytes(fp[2:10], "big", signed=True)
    return bucket, member
