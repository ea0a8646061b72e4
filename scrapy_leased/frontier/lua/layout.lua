#!lua
-- layout: record the crawl's seen-set layout on its first use, atomically, and return it
-- (Frontier.check_layout compares it with the caller's settings).
-- KEYS[1] meta  HASH  the crawl's fixed parameters
-- ARGV[1] seen_bucket_bits  ARGV[2] seen_ttl_ms (LEASED_SEEN_TTL in ms, 0: never)
-- A crawl that has bucket bits but no TTL recorded was started before LEASED_SEEN_TTL
-- existed: its seen set never expires (0 is recorded), so a worker asking for an expiry
-- is refused instead of ignoring the seen set it has.
-- Returns {seen_bucket_bits, seen_ttl_ms} as recorded.
if redis.call('HSETNX', KEYS[1], 'seen_bucket_bits', ARGV[1]) == 1 then
  redis.call('HSETNX', KEYS[1], 'seen_ttl_ms', ARGV[2])
else
  redis.call('HSETNX', KEYS[1], 'seen_ttl_ms', 0)
end
return redis.call('HMGET', KEYS[1], 'seen_bucket_bits', 'seen_ttl_ms')
