-- run_join: a worker opens (or waits while another worker seeds): may it skip start()?
-- A run lasts while workers are alive: the first worker of a run seeds it (runs
-- start()), the others wait until it is seeded, then skip start(). The run marker names
-- its seeder until start() is exhausted, then reads 'seeded'. When the seeder of an
-- unseeded run has no heartbeat younger than the worker TTL (it died), the caller seeds
-- it again. Live workers refresh the marker's expiry (run_refresh.lua); when every
-- worker is gone it expires (or the last worker to leave deletes it, run_leave.lua),
-- and the next worker starts a new run. A run that ended within its grace
-- (LEASED_RUN_GRACE: run_leave.lua left the marker 'ended') is joined as a seeded one,
-- and is on again (the marker reads 'seeded').
-- KEYS[1] run      STRING  seeder's worker id, 'seeded', or 'ended' (within the grace)
-- KEYS[2] workers  ZSET    worker id -> last heartbeat (ms of Redis TIME)
-- ARGV[1] worker id  ARGV[2] run marker expiry ms  ARGV[3] worker TTL ms
-- Returns 0: the run is seeded (skip start()); 1: this worker seeds it (now the marker
-- names it); 2: another live worker is seeding it (ask again later).
local now = server_ms()
redis.call('ZADD', KEYS[2], now, ARGV[1])
local cur = redis.call('GET', KEYS[1])
if cur then
  if cur == 'seeded' then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 0
  end
  if cur == 'ended' then
    redis.call('SET', KEYS[1], 'seeded', 'PX', ARGV[2])
    return 0
  end
  if cur == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
  end
  local beat = redis.call('ZSCORE', KEYS[2], cur)
  if beat and now - tonumber(beat) < tonumber(ARGV[3]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 2
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
