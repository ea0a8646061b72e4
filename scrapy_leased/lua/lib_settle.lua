-- Shared helpers, prepended by Python to the scripts that queue or settle requests
-- (commit.lua, claim.lua, recover.lua, release.lua). Not a script on its own.
--
-- Requests are queued per lane (the key of their rate budget, by default their host):
-- one queue ZSET per lane, the `lanes` ZSET (lane -> time from which it may be
-- served, ms) holding every lane that has queued requests, and the `todo` counter.
--
-- An envelope is "<rid>|<attempts>|<expiries>|<priority>|<lane>|<payload>":
--   rid       request id, fixed at first enqueue (the done bitmap's offset)
--   attempts  failed or expired processing attempts so far
--   expiries  how many of those were lease expiries (its worker died while holding it:
--             workers process such a request alone, so a crash is charged to the
--             request that causes it, not to those that happened to be in flight)
--   priority  Scrapy priority (integer); the queue's score is -priority
--   lane      the lane whose queue holds it (no '|'; '' is the default lane)
--   payload   the request as JSON (opaque here)
-- A queue member is "<12 hex digits of a fresh sequence number><envelope>":
-- equal scores sort by member, so one priority is FIFO. A released request is put
-- back in front as "<space><11 hex digits of its rid><envelope>" (space sorts
-- before every digit, and released requests keep their enqueue order).

-- The done bitmap takes offsets below 2^32; rids beyond are never marked done.
local MAX_BITMAP_RID = 4294967295

-- At most n bytes of s, never cutting a UTF-8 character in two.
local function clip(s, n)
  if #s <= n then return s end
  while n > 0 do
    local b = string.byte(s, n + 1)
    if b < 128 or b >= 192 then break end
    n = n - 1
  end
  return string.sub(s, 1, n)
end

local function parse_envelope(env)
  return string.match(env, '^(%d+)|(%d+)|(%d+)|(%-?%d+)|([^|]*)|(.*)$')
end

-- keys: {seq, lanes, todo}; queue_key: the lane's queue.
local function queue_push(keys, queue_key, lane, env, priority, front, rid)
  local prefix
  if front then
    prefix = ' ' .. string.format('%011x', rid)
  else
    prefix = string.format('%012x', redis.call('INCR', keys.seq))
  end
  redis.call('ZADD', queue_key, -tonumber(priority), prefix .. env)
  redis.call('ZADD', keys.lanes, 'NX', 0, lane)
  redis.call('INCR', keys.todo)
end

-- Count one failed attempt of an envelope taken out of processing; requeue it at the
-- back of its priority, or park it in the dead letters once max_attempts is reached
-- (at once when permanent). expired is 1 when the lease expired, else 0.
-- keys: {seq, lanes, todo, dead, stats}; queue_key: the queue of the envelope's lane.
-- Returns 1 when parked, 0 when requeued.
local function settle_failure(keys, queue_key, env, reason, max_attempts, permanent, now_ms,
                              expired)
  local rid, attempts, expiries, priority, lane, payload = parse_envelope(env)
  if not rid then
    redis.call('HSET', keys.dead, 'malformed:' .. redis.sha1hex(env), cjson.encode({
      reason = 'malformed envelope: ' .. clip(reason, 400), attempts = 0,
      envelope = env, t = now_ms}))
    redis.call('HINCRBY', keys.stats, 'dead', 1)
    return 1
  end
  attempts = tonumber(attempts) + 1
  expiries = tonumber(expiries) + expired
  if permanent or attempts >= max_attempts then
    redis.call('HSET', keys.dead, rid, cjson.encode({
      reason = clip(reason, 2000), attempts = attempts,
      envelope = rid .. '|0|0|' .. priority .. '|' .. lane .. '|' .. payload, t = now_ms}))
    redis.call('HINCRBY', keys.stats, 'dead', 1)
    return 1
  end
  queue_push(keys, queue_key, lane, rid .. '|' .. attempts .. '|' .. expiries .. '|' .. priority
    .. '|' .. lane .. '|' .. payload, priority, false)
  return 0
end
