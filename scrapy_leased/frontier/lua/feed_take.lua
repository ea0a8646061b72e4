#!lua
-- feed_take: take a batch of entries off the crawl's feed (a LIST of JSON requests any
-- producer pushes to, feed/format.py), to be turned into requests by this worker and
-- queued by feed_commit.lua. The batch is kept in `feed_taken` under the worker's id
-- until that commit, with a deadline in `feed_deadlines`: a worker that dies (or stalls)
-- between the two loses nothing, its batch goes back to the head of the feed, in order,
-- at the next take of any worker after the deadline. A worker whose earlier batch is
-- still held (its commit's outcome unknown) gets the same batch again.
-- KEYS[1] feed            LIST  JSON entries, in the order pushed (RPUSH)
-- KEYS[2] feed_taken      HASH  worker id -> "<batch id> <JSON array of the entries it
--                               took>", the batch id: Redis TIME in µs at the take
-- KEYS[3] feed_deadlines  ZSET  worker id -> deadline of its batch (ms, Redis TIME)
-- ARGV[1] worker id  ARGV[2] how many entries to take at most  ARGV[3] deadline ms
-- (from now)
-- Returns {entries given back by takers past their deadline, entries left in the feed,
-- the batch id (0 when nothing was taken), entry1, entry2, ...}.
local now = server_ms()
local back = 0
-- a held batch: its id and its entries
local function batch_of(held)
  local id, json = string.match(held, '^(%d+) (.*)$')
  return id, cjson.decode(json)
end
for _, taker in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)) do
  local held = redis.call('HGET', KEYS[2], taker)
  if held then
    local _, entries = batch_of(held)
    for i = #entries, 1, -1 do redis.call('LPUSH', KEYS[1], entries[i]) end
    back = back + #entries
    redis.call('HDEL', KEYS[2], taker)
  end
  redis.call('ZREM', KEYS[3], taker)
end
local id, entries = '0', nil
local held = redis.call('HGET', KEYS[2], ARGV[1])
if held then
  id, entries = batch_of(held)
else
  entries = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
  if #entries > 0 then
    local t = redis.call('TIME')
    id = t[1] .. string.format('%06d', tonumber(t[2]))
    redis.call('LTRIM', KEYS[1], #entries, -1)
    redis.call('HSET', KEYS[2], ARGV[1], id .. ' ' .. cjson.encode(entries))
  end
end
if #entries > 0 then redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[1]) end
local out = {back, redis.call('LLEN', KEYS[1]), id}
for _, e in ipairs(entries) do out[#out + 1] = e end
return out
