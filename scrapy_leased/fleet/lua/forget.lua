#!lua flags=allow-oom
-- forget: remove fingerprints from the crawl's seen set, so that each request is queued
-- again the next time a worker (or `scrapy leased seed`) sends it (`scrapy leased
-- forget`). Nothing is queued here; the done bitmap is left alone (a request queued
-- again gets a new rid, so it is processed and counted again).
-- KEYS[1] stats  HASH crawl counters ('forgotten' counts the entries removed)
-- KEYS[2..] seen buckets (SETs of 64-bit integers), by index below
-- ARGV: n x {index into KEYS of a seen bucket, member}
-- Returns {1 (was in the bucket, removed) or 0 (was not), ...}, one per pair.
local out, removed = {}, 0
for i = 1, #ARGV, 2 do
  local r = redis.call('SREM', KEYS[tonumber(ARGV[i])], ARGV[i + 1])
  out[#out + 1] = r
  removed = removed + r
end
if removed > 0 then redis.call('HINCRBY', KEYS[1], 'forgotten', removed) end
return out
