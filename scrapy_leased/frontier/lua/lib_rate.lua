-- Shared rate-budget helpers (GCRA), prepended by Python to claim.lua, acquire.lua and
-- penalize.lua. Not a script on its own.
--
-- A lane's budget allows one request per `interval` ms with a burst of `burst`: in any
-- window of t ms at most burst + t / interval requests start. State, in the lane's rate
-- HASH (every time is Redis server time, in ms):
--   tat  theoretical arrival time of the next request (GCRA)
--   blk  no request before this time (Retry-After, 429/503)
--   pf   slowdown factor set by a 429/503, halving every half_life ms; pt when set
--   cd   robots.txt Crawl-delay in ms (the interval never goes below it)
--   ctat the same GCRA clock for claims: claims of the lane are paced at the budget's
--        rate too, so workers do not claim requests the budget cannot serve soon
--        (tat, taken at download time, is what the guarantee rests on)
--   ti, cti  the interval at which tat, ctat were last advanced. The time a clock runs
--        ahead of now stands for (tat - now) / ti requests already started; when the
--        interval changes (Crawl-delay, a slowdown and its recovery), that much is
--        rescaled to the new interval, so a longer interval does not let a burst through
--        on credit counted at the shorter one.
-- interval 0 means no budget: only blk and cd apply.

local function rate_state(key)
  local v = redis.call('HMGET', key, 'tat', 'blk', 'pf', 'pt', 'cd')
  return tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 1, tonumber(v[4]) or 0,
    tonumber(v[5]) or 0
end

-- Whether a lane has nothing to enforce for certain: no budget (interval 0) and no
-- rate HASH (no block, slowdown or Crawl-delay was ever set, or it expired), as the
-- state of a missing HASH would say. One EXISTS instead of an HMGET of five fields
-- (about a third of its instructions): most lanes of most crawls are such lanes.
local function unbound(key, interval)
  return interval == 0 and redis.call('EXISTS', key) == 0
end

local function slowdown(pf, pt, now, half_life)
  if pf <= 1 then return 1 end
  return math.max(1, pf * 0.5 ^ ((now - pt) / half_life))
end

local function effective_interval(interval, pf, pt, cd, now, half_life)
  return math.max(interval * slowdown(pf, pt, now, half_life), cd)
end

-- A GCRA clock (field f, its interval in field fi) at interval t: at least now, and the
-- time it ran ahead of now rescaled from the interval it was advanced at to t.
local function rate_clock(key, f, fi, t, now)
  local v = redis.call('HMGET', key, f, fi)
  local at, ti = math.max(tonumber(v[1]) or 0, now), tonumber(v[2])
  if ti and ti > 0 and ti ~= t and at > now then at = now + (at - now) * t / ti end
  return at
end

-- How many requests of the lane may be claimed now, and the lane's effective interval
-- (0: no budget); when none may, the time from which one may.
local function rate_claimable(key, interval, burst, now, half_life)
  if unbound(key, interval) then return 1000000000, 0, now end
  local tat, blk, pf, pt, cd = rate_state(key)
  if now < blk then return 0, 0, blk end
  local t = effective_interval(interval, pf, pt, cd, now, half_life)
  if t <= 0 then return 1000000000, 0, now end
  local tau = (burst - 1) * t
  local ctat = rate_clock(key, 'ctat', 'cti', t, now)
  local n = math.floor((now + tau - ctat) / t) + 1
  if n <= 0 then return 0, t, ctat - tau end
  return math.min(n, burst), t, now
end

-- Record n claims of the lane (interval t > 0); returns when the next may be claimed.
local function rate_claimed(key, n, t, burst, now)
  local ctat = rate_clock(key, 'ctat', 'cti', t, now) + n * t
  redis.call('HSET', key, 'ctat', ctat, 'cti', t)
  redis.call('PEXPIRE', key, math.floor(ctat - now) + 3600000)
  return ctat - (burst - 1) * t
end

-- Take one request's worth of budget. Returns (wait, ready): wait 0 when the request
-- may start now, else the ms to wait; ready is when the lane can start another one.
local function rate_take(key, interval, burst, now, half_life)
  if unbound(key, interval) then return 0, now end
  local tat, blk, pf, pt, cd = rate_state(key)
  if now < blk then return blk - now, blk end
  local t = effective_interval(interval, pf, pt, cd, now, half_life)
  if t <= 0 then return 0, now end
  local tau = (burst - 1) * t
  tat = rate_clock(key, 'tat', 'ti', t, now)
  if tat - tau > now then return tat - tau - now, tat - tau end
  tat = tat + t
  redis.call('HSET', key, 'tat', tat, 'ti', t)
  redis.call('PEXPIRE', key, math.floor(tat - now) + 3600000)
  return 0, tat - tau
end
