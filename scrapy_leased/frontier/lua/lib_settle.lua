-- Shared helpers, prepended by Python to the scripts that queue or settle requests
-- (commit.lua, claim.lua, recover.lua, release.lua). Not a script on its own.
--
-- Requests are queued per lane (the key of their rate budget, by default their host),
-- and within a lane per tier: a priority, and for start requests kept apart (Scrapy's
-- SCHEDULER_START_*_QUEUE) a tier of their own after the regular requests of that
-- priority, before the next lower priority. Tier codes: "p<priority>" regular, "s<priority>"
-- start requests (keys.py tier_code), ranked by -priority, + 0.5 for start tiers
-- (keys.py tier_rank). A lane's queue is:
--   LIST  `fifo:<lane>` tier p0, regular requests of priority 0 (Scrapy's default, and
--         what every link gets unless DEPTH_PRIORITY or the spider says otherwise);
--   LIST  `tier:<code>:<lane>` one per other tier that has queued requests;
--   ZSET  `queue:<lane>` the lane's tier index: the codes of those other tiers,
--         scored by rank. A tier is in it exactly while its LIST exists (the push that
--         creates the LIST adds it, the pop that empties it removes it), so it stays
--         as small as the number of tiers in use.
-- Members are bare envelopes. Claims serve the lowest rank first (p0 ranks 0: before
-- s0 and every negative priority, after every positive one), each tier from its head:
-- a LIFO request is pushed at the head, a FIFO or requeued one at the tail, a released
-- one back at the head (release.lua pushes them in reverse, so they keep their order).
-- Queue order codes (queue_push's `order`, from the worker): "L" regular LIFO,
-- "F" regular FIFO, "S" start FIFO, "T" start LIFO; nil: at the back, FIFO (requeues:
-- a requeued request is queued as a regular request of its priority).
-- Every key is passed in KEYS (Redis Cluster): the caller names the LIST of the tier it
-- pushes to, the lane's tier index right after it (lane_queue), so the caller knows
-- each request's tier (its priority is in its envelope). A claim cannot pop a tier it
-- was not given the key of: see claim.lua.
-- A LIST entry costs about its length (BENCHMARKS.md, section 2b); a ZSET member of a
-- large ZSET (the layout before this one) also paid a skiplist node and a dict entry.
-- The `lanes` ZSET (lane -> time from which it may be served, ms) holds every lane that
-- has queued requests, and `todo` counts them.
--
-- Envelopes: lib_envelope.lua (prepended before this file).

-- The done bitmap takes offsets below 2^32; rids beyond are never marked done.
local MAX_BITMAP_RID = 4294967295

-- At most n bytes of s, never cutting a UTF-8 character in two.
local function clip(s, n)
  if #s <= n then return s end
  while n > 0 do
    local b = string.byte(s, n + 1)
    if b < 128 or b >= 192 then break end
    n = n - 1
  end
  return string.sub(s, 1, n)
end

-- The length of the valid UTF-8 sequence starting at byte i of s, or nil (what
-- Python's strict UTF-8 decoder accepts: no overlong forms, no surrogates).
local function utf8_seq(s, i)
  local c = string.byte(s, i)
  if c < 128 then return 1 end
  local len, lo, hi = 0, 128, 191
  if c >= 194 and c <= 223 then len = 2
  elseif c >= 224 and c <= 239 then
    len = 3
    if c == 224 then lo = 160 elseif c == 237 then hi = 159 end
  elseif c >= 240 and c <= 244 then
    len = 4
    if c == 240 then lo = 144 elseif c == 244 then hi = 143 end
  else
    return nil
  end
  if i + len - 1 > #s then return nil end
  local b = string.byte(s, i + 1)
  if b < lo or b > hi then return nil end
  for j = i + 2, i + len - 1 do
    b = string.byte(s, j)
    if b < 128 or b > 191 then return nil end
  end
  return len
end

local ASCII_CHUNK = 4000  -- bytes per string.byte call (Lua's C stack holds ~8,000)

-- Whether s is valid UTF-8 (a queue member pushed by hand may not be).
local function utf8_valid(s)
  -- ASCII (the usual case) needs no decoding: the largest byte, in a few C calls (a
  -- pattern search for a byte above 127 costs ~15 times as much)
  local ascii = true
  for i = 1, #s, ASCII_CHUNK do
    if math.max(0, string.byte(s, i, i + ASCII_CHUNK - 1)) > 127 then
      ascii = false
      break
    end
  end
  if ascii then return true end
  local i = 1
  while i <= #s do
    local len = utf8_seq(s, i)
    if not len then return false end
    i = i + len
  end
  return true
end

-- s with every byte that is not part of valid UTF-8 replaced by '?'.
local function utf8_clean(s)
  if utf8_valid(s) then return s end
  local parts, i = {}, 1
  while i <= #s do
    local len = utf8_seq(s, i)
    if len then
      parts[#parts + 1] = string.sub(s, i, i + len - 1)
      i = i + len
    else
      parts[#parts + 1] = '?'
      i = i + 1
    end
  end
  return table.concat(parts)
end

-- The tier code of a priority (an integer, as a string) and start flag (keys.py
-- tier_code), and its rank in the tier index (keys.py tier_rank).
local function tier_code(priority, start)
  local p = tonumber(priority)
  if p == math.floor(p) and math.abs(p) < 9007199254740992 then
    priority = string.format('%d', p)
  end
  return (start and 's' or 'p') .. priority
end

local function tier_rank(priority, start)
  return -tonumber(priority) + (start and 0.5 or 0)
end

-- A queue LIST at KEYS[i] (a lane's fifo LIST or one of its tier LISTs), its lane's
-- tier index at KEYS[i + 1].
local function lane_queue(i)
  return {l = KEYS[i], idx = KEYS[i + 1]}
end

-- nil when each ARGV[i], i = first, first + step, ..., last, is the index of a queue
-- LIST in KEYS (lane_queue: its lane's tier index after it), else the error reply naming
-- it. A script checks the indexes it will requeue to before its first write: a bad one
-- would stop it at the push, after the request left its lease (and be lost).
local function queue_index_error(script, first, last, step)
  for i = first, last, step do
    local q = tonumber(ARGV[i])
    if not q or q ~= math.floor(q) or q < 1 or q + 1 > #KEYS then
      return redis.error_reply(script .. ': ARGV[' .. i .. '] is not the index of a queue in '
        .. 'KEYS: ' .. tostring(ARGV[i]))
    end
  end
  return nil
end

-- keys: {lanes, todo}; q: the LIST of the request's tier in its lane (lane_queue; the
-- caller's: a start request of priority 0 or any request of another priority goes to
-- its tier's LIST, a regular one of priority 0 to the fifo LIST); front: a released
-- request (at the head); order: see above.
local function queue_push(keys, q, lane, env, priority, front, order)
  local start = order == 'S' or order == 'T'
  local n
  if front or order == 'L' or order == 'T' then
    n = redis.call('LPUSH', q.l, env)
  else
    n = redis.call('RPUSH', q.l, env)
  end
  if n == 1 and (start or tonumber(priority) ~= 0) then
    redis.call('ZADD', q.idx, tier_rank(priority, start), tier_code(priority, start))
  end
  redis.call('ZADD', keys.lanes, 'NX', 0, lane)
  redis.call('INCR', keys.todo)
end

-- Count one failed attempt of an envelope taken out of processing; requeue it at the
-- back of its priority, or park it in the dead letters once max_attempts is reached
-- (at once when permanent). expired is 1 when the lease expired, else 0.
-- keys: {lanes, todo, dead, stats}; q: the LIST of the envelope's regular tier (its
-- priority) in its lane, and the lane's tier index (lane_queue).
-- Returns 1 when parked, 0 when requeued.
local function settle_failure(keys, q, env, reason, max_attempts, permanent, now_ms,
                              expired)
  local rid, attempts, expiries, priority, lane, payload = parse_envelope(env)
  if not rid then
    redis.call('HSET', keys.dead, 'malformed:' .. redis.sha1hex(env), cjson.encode({
      reason = 'malformed envelope: ' .. clip(reason, 400), attempts = 0,
      envelope = utf8_clean(env), t = now_ms}))
    redis.call('HINCRBY', keys.stats, 'dead', 1)
    return 1
  end
  attempts = tonumber(attempts) + 1
  expiries = tonumber(expiries) + expired
  if permanent or attempts >= max_attempts then
    redis.call('HSET', keys.dead, rid, cjson.encode({
      reason = clip(reason, 2000), attempts = attempts,
      envelope = make_envelope(rid, 0, 0, priority, lane, payload), t = now_ms}))
    redis.call('HINCRBY', keys.stats, 'dead', 1)
    return 1
  end
  queue_push(keys, q, lane, make_envelope(rid, attempts, expiries, priority, lane, payload),
    priority, false)
  return 0
end
