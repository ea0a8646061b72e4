-- Shared helper, prepended by Python (scripts.py) to the scripts that add a worker's
-- Scrapy stats deltas to the crawl's fleet stats (stats_flush.lua, and commit.lua: a
-- commit that settles claims carries the stats of their processing). Not a script on
-- its own.

-- A stat value sent must be a finite decimal number (as Python's str(int) or repr(float)
-- writes it) of at most this size; the worker sends no other (fleet/stats.py).
local STAT_LIMIT = 9223372036854775808  -- 2^63
local STAT_OPS = {i = true, f = true, max = true, min = true}

-- The number of a stat triple's value, or nil when the triple is not one to apply: an
-- unknown op, or a value that is not a finite decimal number within STAT_LIMIT (nan,
-- inf, 1e400, hex, spaces: HINCRBYFLOAT would refuse some, and 'max' would store them).
local function stat_number(op, value)
  if not STAT_OPS[op] or not (string.match(value, '^%-?%d+%.?%d*$')
      or string.match(value, '^%-?%d+%.?%d*[eE][%-+]?%d+$')) then
    return nil
  end
  local v = tonumber(value)
  if not v or v ~= v or v > STAT_LIMIT or v < -STAT_LIMIT then return nil end
  return v
end

-- Apply the triples {op, stat name, value} of ARGV[first..last] to the HASH `key`: op
-- 'i' adds an integer (HINCRBY; HINCRBYFLOAT when the stat is a float already), 'f'
-- adds a float (HINCRBYFLOAT), 'max' keeps the larger, 'min' keeps the smaller
-- (fleet/stats.py stat_op). Never fails half-way: each triple is checked before its
-- write (stat_number) and each write is a pcall, so a triple refused (its value, or a
-- stat or key Redis cannot add to: set by hand to a string, or of another type) is
-- skipped and the others applied. Returns how many were refused. An 'i' (nearly every
-- stat) goes to HINCRBY unchecked: HINCRBY takes only a decimal integer within 2^63,
-- which stat_number accepts too, so the check is made only when HINCRBY refuses (the
-- value is no such integer, or the stat is a float): a third of a stat's cost saved.
local function apply_stats(key, first, last)
  local refused = 0
  for i = first, last, 3 do
    local op, name, value = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local r = nil
    if op == 'i' then r = redis.pcall('HINCRBY', key, name, value) end
    if type(r) ~= 'number' then
      r = nil
      local v = stat_number(op, value)
      if not v then
        r = false
      elseif op == 'i' or op == 'f' then  -- 'i': beside a float stat, or written as one
        r = redis.pcall('HINCRBYFLOAT', key, name, value)
      else
        local cur = redis.pcall('HGET', key, name)
        if type(cur) == 'table' then
          r = cur
        else
          cur = tonumber(cur)
          if not cur or cur ~= cur or (op == 'max' and v > cur) or (op == 'min' and v < cur) then
            r = redis.pcall('HSET', key, name, value)
          end
        end
      end
    end
    if r == false or (type(r) == 'table' and r.err) then refused = refused + 1 end
  end
  return refused
end
