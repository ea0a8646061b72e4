#!lua
-- fleet_open: a worker whose final stats flush is still to come says so (observe/stats.py:
-- at open, then at each stats heartbeat), so that the last worker of the run waits for
-- its stats before it sends fleet_closed (fleet_close.lua). A worker open means a run
-- goes on: the last run's closer is forgotten. Entries not refreshed for ARGV[2] ms
-- (workers killed) are removed.
-- KEYS[1] stats_open  ZSET worker id -> when it was last seen (ms of Redis TIME)
-- KEYS[2] closed_by   STRING the worker that sent fleet_closed for the last run
-- ARGV[1] worker id  ARGV[2] prune ms
-- Returns 1.
local now = server_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('DEL', KEYS[2])
return 1
