#!lua flags=allow-oom
-- renew: heartbeat of one worker. Refreshes its registry entry and extends the
-- leases it still holds. A lease that was already reaped is NOT recreated (ZADD XX),
-- and only the caller's own leases are renewed: a token whose owner (the `owners` HASH)
-- is another worker, or that has no owner, is reported lost and left alone.
-- Runs when Redis is out of memory (allow-oom: it only extends what exists), so a live
-- worker keeps its leases while recovery, which needs memory, is refused.
-- Registry entries of workers silent for longer than the prune age are removed (up to
-- 1000 per call), with their info and ack count: a worker killed without closing leaves
-- its entry behind.
-- KEYS[1] leases  ZSET token -> deadline (ms)
-- KEYS[2] workers ZSET worker id -> last heartbeat (ms)
-- KEYS[3] worker_info HASH worker id -> JSON about the worker
-- KEYS[4] owners  HASH claim token -> worker id holding it
-- KEYS[5] control HASH the fleet's control state (keys.py), reported to the worker
-- KEYS[6] worker_acked HASH worker id -> requests it acked (commit.lua): pruned with
--         the registry entry
-- then the guard's four KEYS (lib_guard.lua: epoch, tokens, rids, any key)
-- ARGV[1] lease length in ms  ARGV[2] worker id  ARGV[3] worker info JSON ('' = keep)
-- ARGV[4] prune age ms (0 = never prune)
-- ARGV[5..] claim tokens held, then the guard's four ARGV (call id '', epoch, token, rid)
-- Returns {epoch, tokens, rids (lib_guard.lua), now_ms, control state (running, paused,
-- stopping), lost token, lost token, ...}
if not tonumber(ARGV[1]) or not tonumber(ARGV[4]) then  -- before any write
  return redis.error_reply('renew: lease ms and prune ms must be numbers, not ' ..
    tostring(ARGV[1]) .. ', ' .. tostring(ARGV[4]))
end
-- The control state read before any write, and only when it is a hash: a key of
-- another type (a SET by hand) must not stop the renewals, which keep the work in
-- progress; it reads as absent (running), and the worker's next claim, refused,
-- moves it aside (key_aside.lua).
local state = 'running'
if not key_type_error(KEYS[5], 'hash', CONTROL_WHAT) then
  state = redis.call('HGET', KEYS[5], 'state') or 'running'
end
local g = guard_open()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now, ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[3], ARGV[2], ARGV[3]) end
local prune = tonumber(ARGV[4])
if prune > 0 then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - prune, 'LIMIT', 0, 1000)
  if #gone > 0 then
    redis.call('ZREM', KEYS[2], unpack(gone))
    redis.call('HDEL', KEYS[3], unpack(gone))
    redis.call('HDEL', KEYS[6], unpack(gone))
  end
end
local deadline = now + tonumber(ARGV[1])
local out = {now, state}
-- Each token's owner and lease read at once (HMGET, ZMSCORE), the leases kept extended
-- at once (ZADD XX).
local tokens = {}
for i = 5, #ARGV - GUARD_ARGS do tokens[#tokens + 1] = ARGV[i] end
local owner = batch_call('HMGET', KEYS[4], tokens, nil, true)
local leased = batch_call('ZMSCORE', KEYS[1], tokens, nil, true)
local extend = {}
for i, token in ipairs(tokens) do
  if owner[i] ~= ARGV[2] or not leased[i] then
    out[#out + 1] = token
  else
    extend[#extend + 1] = deadline
    extend[#extend + 1] = token
  end
end
batch_call('ZADD', KEYS[1], extend, 'XX')
return guard_reply(g, out)
