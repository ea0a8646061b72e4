-- run_leave: a worker closed (and left the registry): when no live worker is left,
-- the run is over, and the next worker to open starts a new one (runs start() again).
-- KEYS[1] run  STRING  KEYS[2] workers  ZSET worker id -> last heartbeat (ms)
-- ARGV[1] worker id (removed from the registry, if still there)  ARGV[2] worker TTL ms
-- Returns 1 when the run ended, else 0.
local now = server_ms()
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('ZCOUNT', KEYS[2], now - tonumber(ARGV[2]) + 1, '+inf') == 0 then
  return redis.call('DEL', KEYS[1])
end
return 0
