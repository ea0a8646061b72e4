-- run_leave: a worker closed (and left the registry): when no live worker is left,
-- the run is over, and the next worker to open starts a new one (runs start() again),
-- unless it opens within the run's grace (LEASED_RUN_GRACE): a run that was seeded
-- stays joinable that long as 'ended' (run_join.lua: a worker joining it skips start(),
-- as workers of one run do; run_flush.lua: no fresh run while the marker lives), so
-- that workers started seconds apart (Scrapyd jobs) make one run, not one each.
-- KEYS[1] run  STRING  KEYS[2] workers  ZSET worker id -> last heartbeat (ms)
-- ARGV[1] worker id (removed from the registry, if still there)  ARGV[2] worker TTL ms
-- ARGV[3] grace ms (0: the run ends at once)
-- Returns 1 when the run ended (or ended and stays joinable for the grace), else 0.
local now = server_ms()
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('ZCOUNT', KEYS[2], now - tonumber(ARGV[2]) + 1, '+inf') == 0 then
  local cur = redis.call('GET', KEYS[1])
  local grace = tonumber(ARGV[3]) or 0
  if grace > 0 and (cur == 'seeded' or cur == 'ended') then
    redis.call('SET', KEYS[1], 'ended', 'PX', math.floor(grace))
    return 1
  end
  return redis.call('DEL', KEYS[1])
end
return 0
