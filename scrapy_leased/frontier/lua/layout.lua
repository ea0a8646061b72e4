#!lua
-- layout: record the crawl's seen-set layout and its queues' layout on its first use,
-- atomically, and return them (Frontier.check_layout compares them with the caller's).
-- KEYS[1] meta   HASH  the crawl's fixed parameters
-- KEYS[2] lanes  ZSET  lane -> time from which it may be served: every lane with queued
--                requests
-- ARGV[1] seen_bucket_bits  ARGV[2] seen_ttl_ms (LEASED_SEEN_TTL in ms, 0: never)
-- ARGV[3] the caller's queue layout (keys.py QUEUE_LAYOUT)
-- ARGV[4] for a crawl without a queue layout recorded: '0' record nothing, '1' record
--         ARGV[3] if nothing is queued (no lane in `lanes`), '2' record ARGV[3] (the
--         caller found no queue of the earlier layout)
-- A crawl that has bucket bits but no TTL recorded was started before LEASED_SEEN_TTL
-- existed: its seen set never expires (0 is recorded), so a worker asking for an expiry
-- is refused instead of ignoring the seen set it has. One that has no queue layout
-- recorded was started before the layout was recorded (layout 1: a ZSET per lane for
-- every priority but 0).
-- Returns {seen_bucket_bits, seen_ttl_ms, queue_layout (false: none)} as recorded.
if redis.call('HSETNX', KEYS[1], 'seen_bucket_bits', ARGV[1]) == 1 then
  redis.call('HSETNX', KEYS[1], 'seen_ttl_ms', ARGV[2])
  redis.call('HSETNX', KEYS[1], 'queue_layout', ARGV[3])
else
  redis.call('HSETNX', KEYS[1], 'seen_ttl_ms', 0)
  if ARGV[4] == '2' or (ARGV[4] == '1' and redis.call('ZCARD', KEYS[2]) == 0) then
    redis.call('HSETNX', KEYS[1], 'queue_layout', ARGV[3])
  end
end
return redis.call('HMGET', KEYS[1], 'seen_bucket_bits', 'seen_ttl_ms', 'queue_layout')
