-- run_join: a worker opens; decide whether it seeds the crawl's run (runs start()).
-- A run lasts while workers are alive: the first worker of a run seeds it, the others
-- skip start(). The run marker names its seeder until start() is exhausted, then
-- reads 'seeded'. A worker joining a run whose seeder died before finishing start()
-- (no heartbeat younger than the worker TTL) seeds it again. Live workers refresh the
-- marker's expiry (run_refresh.lua); when every worker is gone it expires (or the last
-- worker to leave deletes it, run_leave.lua), and the next worker starts a new run.
-- KEYS[1] run      STRING  seeder's worker id, or 'seeded'
-- KEYS[2] workers  ZSET    worker id -> last heartbeat (ms of Redis TIME)
-- ARGV[1] worker id  ARGV[2] run marker expiry ms  ARGV[3] worker TTL ms
-- Returns 1 when this worker seeds the run, else 0.
local now = server_ms()
redis.call('ZADD', KEYS[2], now, ARGV[1])
local cur = redis.call('GET', KEYS[1])
if cur then
  if cur == 'seeded' then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 0
  end
  local beat = redis.call('ZSCORE', KEYS[2], cur)
  if beat and now - tonumber(beat) < tonumber(ARGV[3]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
