#!lua
-- throttle_share: AutoThrottle's delays, shared by the workers of a crawl
-- (_throttleshare.py). A worker writes the delays its AutoThrottle set for download
-- slots (changed by more than a tenth since it last wrote or adopted them) and reads
-- those of the slots it uses, in one step: each slot's entry is the last delay any
-- worker's AutoThrottle set for it, with the Redis TIME it was written. An entry older
-- than the maximum age is not returned and is deleted (Scrapy forgets an idle slot's
-- delay after a minute too); the hash expires that long after its last write.
-- KEYS[1] throttle  HASH  slot key -> '<delay in seconds> <ms of Redis TIME>'
-- ARGV[1] the maximum age, ms; ARGV[2] n, the number of delays to write; ARGV[3] m, the
-- number of slot keys to read (-1: every entry of the hash);
-- ARGV[4 .. 2n+3] slot key, delay (seconds, a number >= 0) pairs;
-- ARGV[2n+4 .. 2n+m+3] slot keys to read
-- Returns a flat list of slot key, delay pairs: each slot key read with its delay as
-- written (a string), or false when it has none younger than the maximum age (with
-- m = -1, only the entries that have one). Or the error
-- 'THROTTLE_INVALID <argument index> <why>' (nothing written).
local max_age = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local m = tonumber(ARGV[3])
if not max_age or max_age <= 0 then
  return redis.error_reply('THROTTLE_INVALID 1 bad maximum age')
end
if not n or n < 0 or n ~= math.floor(n) or 2 * n + 3 > #ARGV then
  return redis.error_reply('THROTTLE_INVALID 2 bad count')
end
if not m or (m < 0 and m ~= -1) or m ~= math.floor(m)
    or 2 * n + 3 + math.max(m, 0) ~= #ARGV then
  return redis.error_reply('THROTTLE_INVALID 3 bad count')
end
for i = 5, 2 * n + 3, 2 do
  local delay = tonumber(ARGV[i])
  if not delay or delay ~= delay or delay < 0 or delay == math.huge then
    return redis.error_reply('THROTTLE_INVALID ' .. i .. ' delay is not a number >= 0')
  end
end

local now = server_ms()
if n > 0 then
  local sets = {}
  for i = 4, 2 * n + 3, 2 do
    sets[#sets + 1] = ARGV[i]
    sets[#sets + 1] = ARGV[i + 1] .. ' ' .. now
  end
  redis.call('HSET', KEYS[1], unpack(sets))
  redis.call('PEXPIRE', KEYS[1], max_age)
end

-- the delay of an entry younger than the maximum age, or nil
local function fresh(value)
  if not value then return nil end
  local delay, at = string.match(value, '^(%S+) (%d+)$')
  if delay and tonumber(delay) and now - tonumber(at) <= max_age then return delay end
  return nil
end

local out = {}
local stale = {}
if m == -1 then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local delay = fresh(all[i + 1])
    if delay then
      out[#out + 1] = all[i]
      out[#out + 1] = delay
    else
      stale[#stale + 1] = all[i]
    end
  end
else
  for i = 2 * n + 4, #ARGV do
    local value = redis.call('HGET', KEYS[1], ARGV[i])
    local delay = fresh(value)
    out[#out + 1] = ARGV[i]
    out[#out + 1] = delay or false
    if value and not delay then stale[#stale + 1] = ARGV[i] end
  end
end
for i = 1, #stale, 500 do
  redis.call('HDEL', KEYS[1], unpack(stale, i, math.min(i + 499, #stale)))
end
return out
