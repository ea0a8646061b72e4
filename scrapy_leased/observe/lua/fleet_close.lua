#!lua
-- fleet_close: a worker made its final stats flush (observe/stats.py, after it left the
-- run's registry in its scheduler's close). Is it the last worker of the run? Yes when no
-- other worker is live:
-- - crawling: in workers with a heartbeat younger than the worker TTL;
-- - closing with its final stats still to come: in stats_open, seen within the TTL, and
--   out of workers (it left the registry). One in stats_open that is still in workers
--   with an older heartbeat was killed while crawling: it is not waited for (its leases
--   expire as its heartbeat does; the workers that take them over close after that).
-- Scripts run one at a time, so of two workers closing together only the second one to
-- get here is the last: fleet_closed is sent once. The last one gets the fleet's stats,
-- read in the same step (the final flush of every worker that was live is in), clears
-- stats_open (what is left there: workers killed) and is remembered in closed_by: the
-- same call sent again after a lost reply answers the same, another worker's gets {0}.
-- KEYS[1] stats_open   ZSET worker id -> when it was last seen (ms of Redis TIME)
-- KEYS[2] workers      ZSET worker id -> last heartbeat (ms of Redis TIME)
-- KEYS[3] fleet_stats  HASH stat name -> number
-- KEYS[4] closed_by    STRING the worker that sent fleet_closed for the last run
-- ARGV[1] worker id  ARGV[2] worker TTL ms  ARGV[3] how long closed_by is kept, ms
-- Returns {0} when another worker is live or sent fleet_closed, else {1, flat HGETALL of
-- fleet_stats}.
local now = server_ms()
local live = now - tonumber(ARGV[2]) + 1
redis.call('ZREM', KEYS[1], ARGV[1])
local closer = redis.call('GET', KEYS[4])
if closer == ARGV[1] then return {1, redis.call('HGETALL', KEYS[3])} end
if closer then return {0} end
for _, other in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], live, '+inf')) do
  if not redis.call('ZSCORE', KEYS[2], other) then return {0} end  -- closing
end
local others = redis.call('ZCOUNT', KEYS[2], live, '+inf')
local mine = redis.call('ZSCORE', KEYS[2], ARGV[1])  -- still there if its leave failed
if mine and tonumber(mine) >= live then others = others - 1 end
if others > 0 then return {0} end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[3])
return {1, redis.call('HGETALL', KEYS[3])}
