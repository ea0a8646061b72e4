#!lua
-- feed_commit: queue the requests a worker made of the batch it took off the feed
-- (feed_take.lua), dead-letter the entries it could not read, and drop the batch, in
-- one atomic step. Nothing happens when the batch is no longer this worker's (it was
-- past its deadline and went back to the feed: another worker queues it; or this
-- worker holds another batch since: a call delayed past its next take), so an entry
-- is queued once.
-- KEYS[1] lanes  KEYS[2] todo  KEYS[3] stats  KEYS[4] dead
-- KEYS[5] feed_taken  KEYS[6] feed_deadlines
-- KEYS[7..] the new requests' queue LISTs and seen buckets (lib_enqueue.lua)
-- then the guard's four KEYS (lib_guard.lua: epoch, tokens, rids, this worker's feed
-- call key)
-- ARGV[1] worker id  ARGV[2] n_enqueue  ARGV[3] n_bad  ARGV[4] the seen set's expiry
-- in ms (0: none)  ARGV[5] the seen-set generation the keys are for (lib_enqueue.lua:
-- 'SEEN_GENERATION <gen>' error, before any change, when it is not the current one)
-- ARGV[6] the batch id; then the n_enqueue new requests (lib_enqueue.lua: enqueue_new)
-- then n_bad x {entry, reason}: dead letter 'feed:<sha1 of the entry>' (JSON {reason,
-- attempts 0, entry, t}; the same entry twice is one letter), stats 'feed_malformed'
-- (and 'dead' for each new letter)
-- then the guard's four ARGV (call id, epoch, token, rid seen)
-- Returns {epoch, tokens, rids (lib_guard.lua), held (1: done; 0: the batch was not
-- this worker's any more, nothing changed), enqueue results (1 queued, 0 duplicate)...}.
-- stats 'fed' counts the entries taken off the feed (queued, duplicate or dead).
-- Checked before any write (lib_keys.lua): the last steps write these two keys, after
-- the requests were queued.
local err = key_types_error({KEYS[5], 'hash', FEED_TAKEN_WHAT, KEYS[6], 'zset',
  FEED_DEADLINES_WHAT})
if err then return err end
local keys = {lanes = KEYS[1], todo = KEYS[2], stats = KEYS[3]}
local ttl, gen = tonumber(ARGV[4]), tonumber(ARGV[5])
local gen_error = seen_gen_error(ttl, gen)
if gen_error then return gen_error end
local groups, enqueue_error = enqueue_groups('feed_commit', 7, tonumber(ARGV[2]), ttl)
if enqueue_error then return enqueue_error end
local g = guard_open()
local replayed = guard_replayed(g)
if replayed then return replayed end
local worker, n_enq, n_bad = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local held = redis.call('HGET', KEYS[5], worker)
if not held or string.match(held, '^(%d+) ') ~= ARGV[6] then return guard_reply(g, {0}) end
local out = {1}
local a = enqueue_new(keys, g, groups, out, ttl, gen)
if n_bad > 0 then
  local now, new = server_ms(), 0
  for _ = 1, n_bad do
    local entry = utf8_clean(ARGV[a])
    new = new + redis.call('HSET', KEYS[4], 'feed:' .. redis.sha1hex(entry), cjson.encode({
      reason = clip(ARGV[a + 1], 2000), attempts = 0, entry = clip(entry, 10000), t = now}))
    a = a + 2
  end
  if new > 0 then redis.call('HINCRBY', KEYS[3], 'dead', new) end
  redis.call('HINCRBY', KEYS[3], 'feed_malformed', n_bad)
end
redis.call('HINCRBY', KEYS[3], 'fed', n_enq + n_bad)
redis.call('HDEL', KEYS[5], worker)
redis.call('ZREM', KEYS[6], worker)
return guard_reply(g, out)
