#!lua
-- penalize: the host behind a lane asked the whole fleet to slow down.
-- KEYS[1] the lane's rate HASH  KEYS[2] lanes ZSET lane -> ready time (ms)
-- ARGV[1] lane
-- ARGV[2] block ms: no request of the lane before now + this (0 = no block); also
--         moves the lane's next theoretical arrival there, so no burst follows
-- ARGV[3] 1 to double the lane's slowdown factor (at most 16x; it halves every
--         half-life), 0 to leave it
-- ARGV[4] Crawl-delay in ms to record (-1 = leave as is)
-- ARGV[5] slowdown half-life ms
-- ARGV[6] the crawl's penalty channel (CrawlKeys.penalties): the lane is PUBLISHed there,
--         so every worker checks its requests of the lane claimed before this at
--         download time (LeasedRateMiddleware, ratelimit/watch.py)
-- Returns {now_ms, blocked_until_ms}.
local now = server_ms()
local tat, blk, pf, pt = rate_state(KEYS[1])
local block = tonumber(ARGV[2])
if block > 0 and now + block > blk then
  blk = now + block
  redis.call('HSET', KEYS[1], 'blk', blk, 'tat', math.max(tat, blk))
  redis.call('ZADD', KEYS[2], 'XX', blk, ARGV[1])
end
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'pf', math.min(16, 2 * slowdown(pf, pt, now, tonumber(ARGV[5]))),
    'pt', now)
end
if tonumber(ARGV[4]) >= 0 then redis.call('HSET', KEYS[1], 'cd', ARGV[4]) end
redis.call('PEXPIRE', KEYS[1], math.max(0, blk - now) + 3600000)
if ARGV[6] and ARGV[6] ~= '' then redis.call('PUBLISH', ARGV[6], ARGV[1]) end
return {now, blk}
