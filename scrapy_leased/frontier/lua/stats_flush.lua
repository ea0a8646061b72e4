#!lua
-- stats_flush: add one worker's Scrapy stats deltas (since its last flush) to the
-- crawl's fleet stats, once: a flush carries the worker's sequence number, and a flush
-- whose number is not above the last one applied (sent again after its reply was lost)
-- changes nothing.
-- KEYS[1] fleet_stats  HASH stat name -> number
-- KEYS[2] stats_seq    STRING the worker's last flush applied (expires after ARGV[2] ms)
-- ARGV[1] sequence number of this flush (per worker, growing from 1)
-- ARGV[2] how long the sequence number is kept, ms
-- ARGV[3..] triples {op, stat name, value}; op: 'i' add an integer (HINCRBY), 'f' add a
--           float (HINCRBYFLOAT), 'max' keep the larger, 'min' keep the smaller
-- Returns 1 when applied, 0 when it was applied before.
local seq = tonumber(ARGV[1])
if seq <= (tonumber(redis.call('GET', KEYS[2]) or '0') or 0) then return 0 end
for i = 3, #ARGV, 3 do
  local op, name, value = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if op == 'i' then
    local r = redis.pcall('HINCRBY', KEYS[1], name, value)
    if type(r) == 'table' and r.err then  -- the stat was a float elsewhere
      redis.call('HINCRBYFLOAT', KEYS[1], name, value)
    end
  elseif op == 'f' then
    redis.call('HINCRBYFLOAT', KEYS[1], name, value)
  else
    local cur = tonumber(redis.call('HGET', KEYS[1], name))
    local v = tonumber(value)
    if not cur or (op == 'max' and v > cur) or (op == 'min' and v < cur) then
      redis.call('HSET', KEYS[1], name, value)
    end
  end
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
