-- Shared helper, prepended by Python (scripts.py) to the scripts that touch a key an
-- outsider may write (the feed, which any producer pushes to: claim.lua, feed_take.lua,
-- feed_commit.lua, run_flush.lua; the control state, which a person may write by hand:
-- claim.lua, renew.lua, run_flush.lua, worker/lua/cookies_set.lua). Not a script on its own.
--
-- A script checks such a key's type before its first write: a producer that used XADD
-- or SET on the feed would otherwise make a command fail half-way through a script,
-- after earlier writes were applied (Redis does not undo them), and each retry of the
-- call would apply them again. The error names the key and its type; the worker
-- surfaces it (frontier/scripts.py WrongKeyType): a feed or control key of the wrong type
-- is moved aside (key_aside.lua, feed/drain.py, scheduler.py), any other waits until it
-- is fixed.

-- The error reply 'KEYTYPE <key> is a <type>, not a <want> (<what>)', or nil
-- when the key does not exist or holds a `want` (a TYPE name: list, hash, zset, ...).
local function key_type_error(key, want, what)
  local t = redis.call('TYPE', key)
  if type(t) == 'table' then t = t.ok end
  if t == 'none' or t == want then return nil end
  return redis.error_reply('KEYTYPE ' .. key .. ' is a ' .. t .. ', not a ' ..
    want .. ' (' .. what .. ')')
end

-- The first error of key_type_error over {key, want, what} triples, or nil.
local function key_types_error(checks)
  for i = 1, #checks, 3 do
    local err = key_type_error(checks[i], checks[i + 1], checks[i + 2])
    if err then return err end
  end
  return nil
end

local FEED_WHAT = 'the crawl\'s feed: producers push JSON entries with RPUSH, docs/feed.md'
local FEED_TAKEN_WHAT = 'the feed batches taken by workers (feed_taken)'
local FEED_DEADLINES_WHAT = 'the deadlines of the feed batches taken (feed_deadlines)'
local CONTROL_WHAT = 'the fleet\'s control state: set by scrapy leased pause, resume, stop'
