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
  return string.match(env, '^(%d+)|(%d+)|(%d+)|(%-?%d+)|(.*)$')
end

local function queue_push(queue_key, seq_key, env, priority, front, rid)
  local prefix
  if front then
    prefix = ' ' .. string.format('%011x', rid)
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
