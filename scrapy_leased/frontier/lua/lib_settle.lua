-- Shared helpers, prepended by Python to the scripts that queue or settle requests
-- (commit.lua, claim.lua, recover.lua, release.lua). Not a script on its own.
--
-- Requests are queued per lane (the key of their rate budget, by default their host).
-- A lane's queue is two keys, always passed together (the LIST right after the ZSET):
--   LIST  regular requests of priority 0 (Scrapy's default, and what every link gets
--         unless DEPTH_PRIORITY or the spider says otherwise), member: the bare
--         envelope. Claims pop the head: a LIFO request is pushed at the head, a FIFO
--         or requeued one at the tail, a released one back at the head;
--   ZSET  every other request: score -priority for regular requests, -priority + 0.5
--         for start requests kept apart (Scrapy's SCHEDULER_START_*_QUEUE: at equal
--         priority, after the regular requests, before the next lower priority).
--         Member "<12-char prefix><envelope>"; equal scores sort by prefix:
--           " " + 11 hex digits of the rid   released (front, in enqueue order)
--           "!" + 11 hex digits of 2^44-1-seq LIFO (newest first)
--           12 hex digits of seq             FIFO, and requeued requests (at the back)
--         (space < "!" < every digit), seq a fresh number from the `seq` counter.
-- Queue order codes (queue_push's `order`, from the worker): "L" regular LIFO,
-- "F" regular FIFO, "S" start FIFO, "T" start LIFO; nil: at the back, FIFO (requeues:
-- a requeued request is queued as a regular request of its priority).
-- A LIST entry costs about its length; a ZSET member of a large ZSET also pays a
-- skiplist node and a dict entry, about 110 bytes more (BENCHMARKS.md, section 2).
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

-- Whether s is valid UTF-8 (a queue member pushed by hand may not be).
local function utf8_valid(s)
  if not string.find(s, '[\128-\255]') then return true end
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

-- The queue of a lane whose ZSET is KEYS[i] (its LIST is KEYS[i + 1]).
local function lane_queue(i)
  return {z = KEYS[i], l = KEYS[i + 1]}
end

-- keys: {seq, lanes, todo}; q: the lane's queue (lane_queue); order: see above.
local function queue_push(keys, q, lane, env, priority, front, rid, order)
  local start = order == 'S' or order == 'T'
  if tonumber(priority) == 0 and not start then
    if front or order == 'L' then
      redis.call('LPUSH', q.l, env)
    else
      redis.call('RPUSH', q.l, env)
    end
  else
    local prefix
    if front then
      prefix = ' ' .. string.format('%011x', rid)
    elseif order == 'L' or order == 'T' then
      prefix = '!' .. string.format('%011x', 17592186044415 - redis.call('INCR', keys.seq))
    else
      prefix = string.format('%012x', redis.call('INCR', keys.seq))
    end
    local score = -tonumber(priority)
    if start then score = score + 0.5 end
    redis.call('ZADD', q.z, score, prefix .. env)
  end
  redis.call('ZADD', keys.lanes, 'NX', 0, lane)
  redis.call('INCR', keys.todo)
end

-- Count one failed attempt of an envelope taken out of processing; requeue it at the
-- back of its priority, or park it in the dead letters once max_attempts is reached
-- (at once when permanent). expired is 1 when the lease expired, else 0.
-- keys: {seq, lanes, todo, dead, stats}; q: the queue of the envelope's lane.
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
