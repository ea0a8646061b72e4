#!lua
-- run_flush: LEASED_FLUSH_ON_START: start a fresh run of the crawl, deleting its
-- frontier state, unless a run of it is on. Only when no run marker exists (no run is
-- live: the last worker closed, or every worker's heartbeat is older than the marker's
-- expiry; a run that ended less than LEASED_RUN_GRACE ago, its marker 'ended'
-- (run_leave.lua), is still on: a worker starting then joins it; a marker naming the
-- caller is not: it began a run a moment ago, the run it had found on having ended
-- before it joined, and has not seeded it) and no other worker has a heartbeat younger
-- than the worker TTL, the given keys are deleted and the caller becomes the seeder of
-- a new run (as run_join.lua does for the first worker of a run), in one step: of
-- workers starting at the same moment one flushes, and the others find its run and
-- join it (run_join.lua) without flushing.
-- The caller passes the crawl's keys to delete (a SCAN of the crawl's prefix, without
-- the kept ones: the run marker, the worker registry, meta, tokens, epoch, control and
-- the UpsertPipeline records, and the feed: work pushed before any worker started
-- belongs to the run that starts); the `started` field of `control` (LEASED_CLOSE_TIMEOUT)
-- is dropped, so a fresh run counts its timeout from its own first claim, and so is a
-- stop a LEASED_CLOSE_* limit set (it was about the run flushed; the counts it compared
-- are deleted): a stop set by `scrapy leased stop` is kept.
-- KEYS[1] run      STRING  seeder's worker id, or 'seeded'
-- KEYS[2] workers  ZSET    worker id -> last heartbeat (ms of Redis TIME)
-- KEYS[3] control  HASH    the fleet's control state
-- KEYS[4] feed     LIST    kept; the batches taken off it and not queued (feed_taken:
--                  their workers are gone) go back to its head, oldest batch first,
--                  each in its order, as feed_take.lua gives back a batch past its
--                  deadline: they were never queued, and the queues are deleted
-- KEYS[5] feed_taken  HASH  KEYS[6] feed_deadlines  ZSET  (feed_take.lua): deleted
-- KEYS[7] todo STRING  KEYS[8] leases ZSET  KEYS[9] revisit ZSET  KEYS[10] stats HASH:
--                  read for ARGV[4], then deleted with the rest
-- KEYS[11..] keys to delete
-- ARGV[1] worker id  ARGV[2] run marker expiry ms  ARGV[3] worker TTL ms
-- ARGV[4] '1': flush only a crawl that finished (the default of a new run, LEASED_RESUME
--         unset): nothing queued, leased, in the feed or taken off it, or waiting to be
--         revisited, and the control state neither paused nor stopping; '0': whatever
--         is left (LEASED_FLUSH_ON_START)
-- Returns {1, number of keys deleted, feed entries given back, requests done before}
-- when flushed; {0, the run marker or '', the live workers' ids...} when a run is on;
-- {2, queued, leased, in the feed, feed batches taken, revisits, control state} when
-- ARGV[4] is '1' and the crawl has not finished (nothing changed in either case).
-- Errors, before any change, when a feed key or the control state holds another type
-- (lib_keys.lua).
local err = key_types_error({KEYS[4], 'list', FEED_WHAT, KEYS[5], 'hash', FEED_TAKEN_WHAT,
  KEYS[6], 'zset', FEED_DEADLINES_WHAT, KEYS[3], 'hash', CONTROL_WHAT})
if err then return err end
local now = server_ms()
local cur = redis.call('GET', KEYS[1])
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. (now - tonumber(ARGV[3])), '+inf')
local others = {}
for _, w in ipairs(live) do
  if w ~= ARGV[1] then others[#others + 1] = w end
end
if (cur and cur ~= ARGV[1]) or #others > 0 then
  local out = {0, cur or ''}
  for _, w in ipairs(others) do out[#out + 1] = w end
  return out
end
if ARGV[4] == '1' then
  local left = {tonumber(redis.call('GET', KEYS[7]) or '0') or 0, redis.call('ZCARD', KEYS[8]),
    redis.call('LLEN', KEYS[4]), redis.call('HLEN', KEYS[5]), redis.call('ZCARD', KEYS[9])}
  local state = redis.call('HGET', KEYS[3], 'state') or 'running'
  if left[1] > 0 or left[2] > 0 or left[3] > 0 or left[4] > 0 or left[5] > 0
      or state == 'paused' or state == 'stopping' then
    return {2, left[1], left[2], left[3], left[4], left[5], state}
  end
end
local done_before = tonumber(redis.call('HGET', KEYS[10], 'done') or '0') or 0
-- the batches taken, read and decoded before any write: {id, entries} (a value that is
-- not a batch, written by hand, goes back whole, as one entry: dead-lettered by the
-- worker that takes it as unreadable)
local batches = {}
local taken = redis.call('HGETALL', KEYS[5])
for i = 2, #taken, 2 do
  local id, json = string.match(taken[i], '^(%d+) (.*)$')
  local ok, entries = pcall(cjson.decode, json or '')
  if not id or not ok or type(entries) ~= 'table' then
    id, entries = '0', {taken[i]}
  end
  for j = 1, #entries do
    if type(entries[j]) ~= 'string' then entries[j] = cjson.encode(entries[j]) end
  end
  batches[#batches + 1] = {tonumber(id) or 0, entries}
end
table.sort(batches, function(x, y) return x[1] < y[1] end)
local back = 0
for b = #batches, 1, -1 do  -- the newest first: the oldest ends at the head
  local entries = batches[b][2]
  for j = #entries, 1, -1 do redis.call('LPUSH', KEYS[4], entries[j]) end
  back = back + #entries
end
local deleted = redis.call('UNLINK', KEYS[5], KEYS[6])
for i = 7, #KEYS, 500 do
  deleted = deleted + redis.call('UNLINK', unpack(KEYS, i, math.min(i + 499, #KEYS)))
end
redis.call('HDEL', KEYS[3], 'started')
local control = redis.call('HMGET', KEYS[3], 'state', 'reason')
if control[1] == 'stopping' and string.sub(control[2] or '', 1, 13) == 'LEASED_CLOSE_' then
  redis.call('HDEL', KEYS[3], 'state', 'since', 'by', 'reason')
end
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, deleted, back, done_before}
