#!lua
-- control: set the fleet's control state (scrapy leased pause, resume, stop): every
-- worker reads it at its next claim (claim.lua) or heartbeat (renew.lua).
-- KEYS[1] control HASH {state, since, by, reason} (keys.py)
-- ARGV[1] new state: running, paused or stopping  ARGV[2] who sets it (by)
-- ARGV[3] why (reason, may be '')
-- Returns {previous state, since of the previous state (ms, 0 = never set), now_ms}.
local now = server_ms()
local prev = redis.call('HMGET', KEYS[1], 'state', 'since')
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'since', now, 'by', ARGV[2], 'reason', ARGV[3])
return {prev[1] or 'running', tonumber(prev[2] or 0), now}
