-- Shared helpers, prepended by Python to the scripts that settle leases
-- (commit.lua, recover.lua, claim.lua). Not a script on its own.
--
-- An envelope is "<rid>|<attempts>|<expiries>|<priority>|<payload>":
--   rid       request id, fixed at first enqueue (the done bitmap's offset)
--   attempts  failed or expired processing attempts so far
--   expiries  how many of those were lease expiries (its worker died while holding it:
--             workers process such a request alone, so a crash is charged to the
--             request that causes it, not to those that happened to be in flight)
--   priority  Scrapy priority (integer); the queue's score is -priority
--   payload   the request as JSON (opaque here)
-- A queue member is "<12 hex digits of a fresh sequence number><envelope>":
-- equal scores sort by member, so one priority is FIFO.

local function parse_envelope(env)
  return string.match(env, '^(%d+)|(%d+)|(%d+)|(%-?%d+)|(.*)$')
end

local function queue_push(queue_key, seq_key, env, priority, front)
  local prefix
  if front then
    prefix = '000000000000'
  else
    prefix = string.format('%012x', redis.call('INCR', seq_key))
  end
  redis.call('ZADD', queue_key, -tonumber(priority), prefix .. env)
end

-- Count one failed attempt of an envelope taken out of processing; requeue it at the
-- back of its priority, or park it in the dead letters once max_attempts is reached
-- (at once when permanent). expired is 1 when the lease expired, else 0.
-- Returns 1 when parked, 0 when requeued.
local function settle_failure(keys, env, reason, max_attempts, permanent, now_ms, expired)
  local rid, attempts, expiries, priority, payload = parse_envelope(env)
  if not rid then
    redis.call('HSET', keys.dead, 'malformed:' .. redis.sha1hex(env), cjson.encode({
      reason = 'malformed envelope: ' .. string.sub(reason, 1, 400), attempts = 0,
      envelope = env, t = now_ms}))
    redis.call('HINCRBY', keys.stats, 'dead', 1)
    return 1
  end
  attempts = tonumber(attempts) + 1
  expiries = tonumber(expiries) + expired
  if permanent or attempts >= max_attempts then
    redis.call('HSET', keys.dead, rid, cjson.encode({
      reason = string.sub(reason, 1, 500), attempts = attempts,
      envelope = rid .. '|0|0|' .. priority .. '|' .. payload, t = now_ms}))
    redis.call('HINCRBY', keys.stats, 'dead', 1)
    return 1
  end
  queue_push(keys.queue, keys.seq,
    rid .. '|' .. attempts .. '|' .. expiries .. '|' .. priority .. '|' .. payload, priority, false)
  return 0
end

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
