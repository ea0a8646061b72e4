#!lua
-- run_flush: LEASED_FLUSH_ON_START: start a fresh run of the crawl, deleting its
-- frontier state, unless a run of it is on. Only when no run marker exists (no run is
-- live: the last worker closed, or every worker's heartbeat is older than the marker's
-- expiry) and no other worker has a heartbeat younger than the worker TTL, the given
-- keys are deleted and the caller becomes the seeder of a new run (as run_join.lua does
-- for the first worker of a run), in one step: of workers starting at the same moment
-- one flushes, and the others find its run and join it (run_join.lua) without flushing.
-- The caller passes the crawl's keys to delete (a SCAN of the crawl's prefix, without
-- the kept ones: the run marker, the worker registry, meta, tokens, epoch, control and
-- the UpsertPipeline records); the `started` field of `control` (LEASED_CLOSE_TIMEOUT)
-- is dropped, so a fresh run counts its timeout from its own first claim, and so is a
-- stop a LEASED_CLOSE_* limit set (it was about the run flushed; the counts it compared
-- are deleted): a stop set by `scrapy leased stop` is kept.
-- KEYS[1] run      STRING  seeder's worker id, or 'seeded'
-- KEYS[2] workers  ZSET    worker id -> last heartbeat (ms of Redis TIME)
-- KEYS[3] control  HASH    the fleet's control state
-- KEYS[4..] keys to delete
-- ARGV[1] worker id  ARGV[2] run marker expiry ms  ARGV[3] worker TTL ms
-- Returns {1, number of keys deleted} when flushed; {0, the run marker or '', the live
-- workers' ids...} when a run is on (nothing changed).
local now = server_ms()
local cur = redis.call('GET', KEYS[1])
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. (now - tonumber(ARGV[3])), '+inf')
local others = {}
for _, w in ipairs(live) do
  if w ~= ARGV[1] then others[#others + 1] = w end
end
if cur or #others > 0 then
  local out = {0, cur or ''}
  for _, w in ipairs(others) do out[#out + 1] = w end
  return out
end
local deleted = 0
for i = 4, #KEYS, 500 do
  deleted = deleted + redis.call('UNLINK', unpack(KEYS, i, math.min(i + 499, #KEYS)))
end
redis.call('HDEL', KEYS[3], 'started')
local control = redis.call('HMGET', KEYS[3], 'state', 'reason')
if control[1] == 'stopping' and string.sub(control[2] or '', 1, 13) == 'LEASED_CLOSE_' then
  redis.call('HDEL', KEYS[3], 'state', 'since', 'by', 'reason')
end
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, deleted}
