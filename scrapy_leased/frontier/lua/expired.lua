#!lua flags=no-writes
-- expired: read (change nothing) up to N leases whose deadline has passed, with their
-- envelopes, so the caller can name the lane queues that recover.lua needs in KEYS.
-- KEYS[1] leases ZSET token -> deadline (ms)  KEYS[2] inflight HASH token -> envelope
-- ARGV[1] max number of leases
-- Returns {now_ms, expired left after these, token1, envelope1 (or false), ...}
local now = server_ms()
local max = tonumber(ARGV[1])
local tokens = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, max)
local left = 0  -- fewer than max expired: none is left (no ZCOUNT)
if #tokens >= max then left = redis.call('ZCOUNT', KEYS[1], '-inf', now) - #tokens end
local out = {now, left}
local envs = batch_call('HMGET', KEYS[2], tokens, nil, true)
for i, token in ipairs(tokens) do
  out[#out + 1] = token
  out[#out + 1] = envs[i]
end
return out
