-- Shared helper, prepended by Python (scripts.py) to the scripts that add a worker's
-- Scrapy stats deltas to the crawl's fleet stats (stats_flush.lua, and commit.lua: a
-- commit that settles claims carries the stats of their processing). Not a script on
-- its own.

-- Apply the triples {op, stat name, value} of ARGV[first..last] to the HASH `key`: op
-- 'i' adds an integer (HINCRBY; HINCRBYFLOAT when the stat is a float already), 'f'
-- adds a float (HINCRBYFLOAT), 'max' keeps the larger, 'min' keeps the smaller
-- (observe/flush.py stat_op).
local function apply_stats(key, first, last)
  for i = first, last, 3 do
    local op, name, value = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    if op == 'i' then
      local r = redis.pcall('HINCRBY', key, name, value)
      if type(r) == 'table' and r.err then  -- the stat was a float elsewhere
        redis.call('HINCRBYFLOAT', key, name, value)
      end
    elseif op == 'f' then
      redis.call('HINCRBYFLOAT', key, name, value)
    else
      local cur = tonumber(redis.call('HGET', key, name))
      local v = tonumber(value)
      if not cur or (op == 'max' and v > cur) or (op == 'min' and v < cur) then
        redis.call('HSET', key, name, value)
      end
    end
  end
end
