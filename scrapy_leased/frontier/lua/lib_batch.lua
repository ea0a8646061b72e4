-- Shared helper, prepended by Python (scripts.py) to the scripts that read or write many
-- members of one key in a call (claim.lua, commit.lua, renew.lua, expired.lua). Not a
-- script on its own.
--
-- One variadic command (ZADD, HSET, ZREM, HDEL, HMGET, ZMSCORE) costs Redis less than
-- one command per member: a script collects the members of a call and sends them once.
-- Long lists go in chunks of at most BATCH_ARGS elements (Lua's unpack stops near 8,000
-- values).

local BATCH_ARGS = 4000  -- even: pairs (ZADD, HSET) stay whole

-- redis.call(cmd, key[, opt], flat...), in chunks. Returns the reply: integers summed,
-- arrays joined. Sends nothing when flat is empty (returns 0, or {} with `array`).
local function batch_call(cmd, key, flat, opt, array)
  local n = #flat
  if n == 0 then return array and {} or 0 end
  local total = array and {} or 0
  for i = 1, n, BATCH_ARGS do
    local j = math.min(i + BATCH_ARGS - 1, n)
    local r
    if opt then
      r = redis.call(cmd, key, opt, unpack(flat, i, j))
    else
      r = redis.call(cmd, key, unpack(flat, i, j))
    end
    if n <= BATCH_ARGS then return r end
    if array then
      for _, v in ipairs(r) do total[#total + 1] = v end
    else
      total = total + r
    end
  end
  return total
end
