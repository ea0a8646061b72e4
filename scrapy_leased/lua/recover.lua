-- recover: return up to N expired leases to the queue, counting one attempt each
-- (a request that kills its worker every time ends in the dead letters).
-- Safe to run from every worker at once: the script is atomic, so each expired
-- lease is taken by exactly one caller.
-- KEYS[1] queue  KEYS[2] seq  KEYS[3] stats  KEYS[4] leases  KEYS[5] inflight  KEYS[6] dead
-- ARGV[1] max number of leases to recover  ARGV[2] max_attempts
-- Returns {recovered (requeued), dead-lettered, expired leases still left}.
local keys = {queue = KEYS[1], seq = KEYS[2], stats = KEYS[3], dead = KEYS[6]}
local now = server_ms()
local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local requeued, dead = 0, 0
for _, token in ipairs(expired) do
  redis.call('ZREM', KEYS[4], token)
  local env = redis.call('HGET', KEYS[5], token)
  redis.call('HDEL', KEYS[5], token)
  if env then
    if settle_failure(keys, env, 'lease expired: its worker died or stalled', tonumber(ARGV[2]),
        false, now, 1) == 1 then
      dead = dead + 1
    else
      requeued = requeued + 1
    end
  end
end
if requeued > 0 then redis.call('HINCRBY', KEYS[3], 'recovered', requeued) end
return {requeued, dead, redis.call('ZCOUNT', KEYS[4], '-inf', now)}
