-- renew: heartbeat of one worker. Refreshes its registry entry and extends the
-- leases it still holds. A lease that was already reaped is NOT recreated (ZADD XX).
-- KEYS[1] leases  ZSET token -> deadline (ms)
-- KEYS[2] workers ZSET worker id -> last heartbeat (ms)
-- KEYS[3] worker_info HASH worker id -> JSON about the worker
-- ARGV[1] lease length in ms  ARGV[2] worker id  ARGV[3] worker info JSON ('' = keep)
-- ARGV[4..] claim tokens held
-- Returns {now_ms, lost token, lost token, ...}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now, ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[3], ARGV[2], ARGV[3]) end
local deadline = now + tonumber(ARGV[1])
local out = {now}
for i = 4, #ARGV do
  if redis.call('ZADD', KEYS[1], 'XX', 'CH', deadline, ARGV[i]) == 0
      and not redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    out[#out + 1] = ARGV[i]
  end
end
return out
