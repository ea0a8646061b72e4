#!lua
-- acquire: take one request's worth of a lane's rate budget, at the moment the request
-- is about to be downloaded (GCRA, see lib_rate.lua). Every worker shares the budget.
-- KEYS[1] the lane's rate HASH
-- KEYS[2] lanes ZSET lane -> ready time (ms): when the lane cannot start another
--         request before a later time, its entry moves there (XX: only if queued)
-- ARGV[1] lane  ARGV[2] interval ms (0 = no budget)  ARGV[3] burst
-- ARGV[4] slowdown half-life ms
-- Returns {wait_ms, now_ms}: wait 0 when the request may go now.
local now = server_ms()
local wait, ready = rate_take(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]), now,
  tonumber(ARGV[4]))
if ready > now then redis.call('ZADD', KEYS[2], 'XX', ready, ARGV[1]) end
return {wait, now}
