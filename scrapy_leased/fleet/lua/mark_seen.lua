#!lua
-- mark_seen: add fingerprints to the crawl's seen set without queueing anything, so a
-- request with one of them is skipped when a worker (or `scrapy leased seed`) sends it
-- later (`scrapy leased from-scrapy-redis --seen-urls`: pages another crawler fetched
-- already). Entries are added as a worker's new requests add theirs (lib_enqueue.lua):
-- with an expiry, to the current generation's SET, unless the previous one has it.
-- KEYS[1] stats  HASH crawl counters ('marked_seen' counts the entries added)
-- KEYS[2..] seen buckets (SETs of 64-bit integers), by index below; with an expiry, the
--           current generation's SET, the previous one's right after it
-- ARGV[1] the seen set's expiry in ms (0: none); ARGV[2] the generation the caller built
--         the keys for (ignored without an expiry)
-- ARGV[3..] n x {index into KEYS of a seen bucket, member}
-- Returns {1 (added) or 0 (seen already), ...}, one per pair; or the error reply
-- 'SEEN_GENERATION <current generation>' before any write when the caller's generation
-- is not the current one (it sends the call again with that generation's keys).
local ttl, gen = tonumber(ARGV[1]), tonumber(ARGV[2])
if ttl > 0 then
  local now_gen = math.floor(server_ms() / ttl)
  if now_gen ~= gen then return redis.error_reply('SEEN_GENERATION ' .. now_gen) end
end
local out, added = {}, 0
local expire_at = (gen + 2) * ttl
for i = 3, #ARGV, 2 do
  local bucket, member, r = tonumber(ARGV[i]), ARGV[i + 1], 0
  if ttl == 0 then
    r = redis.call('SADD', KEYS[bucket], member)
  elseif redis.call('SISMEMBER', KEYS[bucket + 1], member) == 0 then
    r = redis.call('SADD', KEYS[bucket], member)
    if r == 1 then redis.call('PEXPIREAT', KEYS[bucket], expire_at) end
  end
  out[#out + 1] = r
  added = added + r
end
if added > 0 then redis.call('HINCRBY', KEYS[1], 'marked_seen', added) end
return out
