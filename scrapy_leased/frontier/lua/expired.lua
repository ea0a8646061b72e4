#!lua flags=no-writes
-- expired: read (change nothing) up to N leases whose deadline has passed, with their
-- envelopes, so the caller can name the lane queues that recover.lua needs in KEYS.
-- KEYS[1] leases ZSET token -> deadline (ms)  KEYS[2] inflight HASH token -> envelope
-- ARGV[1] max number of leases
-- Returns {now_ms, expired left after these, token1, envelope1 (or false), ...}
local now = server_ms()
local tokens = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {now, redis.call('ZCOUNT', KEYS[1], '-inf', now) - #tokens}
for _, token in ipairs(tokens) do
  out[#out + 1] = token
  out[#out + 1] = redis.call('HGET', KEYS[2], token)
end
return out
