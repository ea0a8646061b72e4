#!lua
-- recover: return expired leases to their lane's queue, counting one attempt each (a
-- request that kills its worker every time ends in the dead letters). The caller first
-- reads the expired leases with expired.lua to learn their lanes; each lease is checked
-- again here, so every worker may run recovery at once and each expired lease is
-- recovered by exactly one caller.
-- A lease of a claim issued before the current epoch (lib_guard.lua: Redis restarted or
-- went back in time since) is requeued without counting an attempt: Redis may have
-- forgotten the ack of a worker that finished it, or the renewals of one that lives.
-- KEYS[1] lanes  KEYS[2] todo  KEYS[3] stats  KEYS[4] leases
-- KEYS[5] inflight  KEYS[6] dead  KEYS[7] owners (HASH token -> worker id: removed with
-- each lease recovered)  KEYS[8..] queue LISTs, each followed by its lane's tier index
-- (lib_settle.lua lane_queue)
-- then the guard's four KEYS (lib_guard.lua: epoch, tokens, rids, any key)
-- ARGV[1] max_attempts, then pairs {token, index into KEYS of the LIST of the regular
-- tier of its envelope's priority in its lane},
-- then the guard's four ARGV (call id '', epoch, token, rid seen)
-- Returns {epoch, tokens, rids (lib_guard.lua), requeued, dead-lettered, requeued
-- without an attempt}; stats 'recovered' and 'recovered_epoch' count the requeued.
-- checked before any write: the requeue indexes, and max attempts (settle_failure)
local err = queue_index_error('recover', 3, #ARGV - GUARD_ARGS, 2)
if err then return err end
if not tonumber(ARGV[1]) then
  return redis.error_reply('recover: max attempts must be a number, not ' .. tostring(ARGV[1]))
end
local g = guard_open()
local keys = {lanes = KEYS[1], todo = KEYS[2], stats = KEYS[3], dead = KEYS[6]}
local now = server_ms()
local requeued, dead, forgiven = 0, 0, 0
for i = 2, #ARGV - GUARD_ARGS, 2 do
  local token = ARGV[i]
  local deadline = redis.call('ZSCORE', KEYS[4], token)
  if deadline and tonumber(deadline) <= now then
    redis.call('ZREM', KEYS[4], token)
    local env = redis.call('HGET', KEYS[5], token)
    redis.call('HDEL', KEYS[5], token)
    redis.call('HDEL', KEYS[7], token)
    if env then
      local q = lane_queue(tonumber(ARGV[i + 1]))
      local rid, _, _, priority, lane = envelope_head(env)
      if rid and guard_before_epoch(g, token) then
        queue_push(keys, q, lane, env, priority, false)
        forgiven = forgiven + 1
      elseif settle_failure(keys, q, env, 'lease expired: its worker died or stalled',
          tonumber(ARGV[1]), false, now, 1) == 1 then
        dead = dead + 1
      else
        requeued = requeued + 1
      end
    end
  end
end
if requeued > 0 then redis.call('HINCRBY', KEYS[3], 'recovered', requeued) end
if forgiven > 0 then redis.call('HINCRBY', KEYS[3], 'recovered_epoch', forgiven) end
return guard_reply(g, {requeued, dead, forgiven})
