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
-- Every read and check before the first write: the keys' types (a producer may have
-- written the feed key with another command: lib_keys.lua), the batches held past their
-- deadline and this worker's own, each decoded (a held value that is not a batch, written
-- by hand, goes back to the feed whole, as one entry: the worker dead-letters it as
-- unreadable), so a call that fails has changed nothing.
local err = key_types_error({KEYS[1], 'list', FEED_WHAT, KEYS[2], 'hash', FEED_TAKEN_WHAT,
  KEYS[3], 'zset', FEED_DEADLINES_WHAT})
if err then return err end
local count, lease = tonumber(ARGV[2]), tonumber(ARGV[3])
if not count or not lease or count ~= count or lease ~= lease then
  return redis.error_reply('feed_take: count and deadline must be numbers, not ' ..
    tostring(ARGV[2]) .. ', ' .. tostring(ARGV[3]))
end
local now = server_ms()
local back = 0
-- a held batch: its id and its entries
local function batch_of(held)
  local id, json = string.match(held, '^(%d+) (.*)$')
  local ok, entries = pcall(cjson.decode, json or '')
  if not id or not ok or type(entries) ~= 'table' then return '0', {held}, true end
  for i = 1, #entries do
    if type(entries[i]) ~= 'string' then entries[i] = cjson.encode(entries[i]) end
  end
  return id, entries
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)
local returned = {}
for i, taker in ipairs(expired) do
  local held = redis.call('HGET', KEYS[2], taker)
  returned[i] = held and {batch_of(held)} or false
end
local id, entries = '0', nil
local held = redis.call('HGET', KEYS[2], ARGV[1])
local own = held and {batch_of(held)}
if own and own[3] then  -- not a batch: back to the feed like one past its deadline
  local listed = false
  for _, taker in ipairs(expired) do listed = listed or taker == ARGV[1] end
  if not listed then
    expired[#expired + 1] = ARGV[1]
    returned[#expired] = own
  end
end
for i, taker in ipairs(expired) do
  if returned[i] then
    local entries_back = returned[i][2]
    for j = #entries_back, 1, -1 do redis.call('LPUSH', KEYS[1], entries_back[j]) end
    back = back + #entries_back
    redis.call('HDEL', KEYS[2], taker)
    if taker == ARGV[1] then held = nil end
  end
  redis.call('ZREM', KEYS[3], taker)
end
if held then
  id, entries = own[1], own[2]
else
  entries = redis.call('LRANGE', KEYS[1], 0, count - 1)
  if #entries > 0 then
    local t = redis.call('TIME')
    id = t[1] .. string.format('%06d', tonumber(t[2]))
    redis.call('LTRIM', KEYS[1], #entries, -1)
    redis.call('HSET', KEYS[2], ARGV[1], id .. ' ' .. cjson.encode(entries))
  end
end
if #entries > 0 then redis.call('ZADD', KEYS[3], now + lease, ARGV[1]) end
local out = {back, redis.call('LLEN', KEYS[1]), id}
for _, e in ipairs(entries) do out[#out + 1] = e end
return out
