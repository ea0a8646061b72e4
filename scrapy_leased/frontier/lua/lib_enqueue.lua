-- Shared helper, prepended by Python (scripts.py) to the scripts that queue new
-- requests (commit.lua, feed_commit.lua), after lib_settle.lua and lib_guard.lua. Not
-- a script on its own.
--
-- The seen set (keys.py seen_bucket): without an expiry (ttl 0), one SET of 64-bit
-- integers per bucket that only grows. With LEASED_SEEN_TTL (ttl > 0, in ms), one SET
-- per bucket and generation, gen = floor(Redis TIME in ms / ttl): a fingerprint is seen
-- when it is in the bucket of the current or the previous generation, new ones go to
-- the current one, which expires when it is no longer read (at the start of gen + 2).
-- An entry is thus forgotten between ttl and 2 x ttl after it was added (a duplicate
-- found does not renew it). The caller names the generation it built the key names
-- for; seen_gen_error tells it the right one when the generation has changed.

-- nil when the caller's generation is the current one (or there is no expiry), else
-- the error reply 'SEEN_GENERATION <current generation>': returned before any write,
-- so the caller sends the same call again with that generation's keys.
local function seen_gen_error(ttl, gen)
  if ttl == 0 then return nil end
  local now_gen = math.floor(server_ms() / ttl)
  if now_gen ~= gen then return redis.error_reply('SEEN_GENERATION ' .. now_gen) end
  return nil
end

-- The new requests' ARGV (enqueue_new), from a: {g, then g groups x {priority, index
-- into KEYS of the LIST of the group's tier in its lane (the lane's tier index right
-- after it: lib_settle.lua lane_queue), lane, queue order code (lib_settle.lua: L, F, S
-- or T)}, then n requests x {bucket index into KEYS (0 = no dedupe; with an expiry, the
-- current generation's SET, the previous one's right after it), member, group number
-- (1..g), payload}}. What requests share (their lane, priority and order) is sent once
-- per group: an argument costs Redis about as much as a short command (parsed, then
-- made a Lua string). enqueue_args_len: how many ARGV that is.
local function enqueue_args_len(a, n)
  return 1 + 4 * tonumber(ARGV[a]) + 4 * n
end

-- enqueue_new(keys, g, a, n, out, ttl, gen): queue the n new requests whose ARGV start
-- at a (above). Each is deduplicated (SADD to its seen bucket) and pushed as ONE
-- decision, with a new rid. Appends 1 (queued) or 0 (duplicate) per request to out;
-- counts stats 'enqueued' and 'duplicates'. keys: {lanes, todo, stats}; g: the guard
-- (lib_guard.lua); ttl, gen: the seen set's expiry (ms, 0: none) and the generation
-- checked by seen_gen_error. Returns the index of the next ARGV.
-- Per call, not per request: the new requests' rids are counted here and the rids key
-- written once, before any of them is pushed (never below a rid in a queue, were the
-- script to stop half-way); one push per LIST and end (in the order given), one ZADD NX
-- of the lanes, one INCRBY of todo. As queue_push (lib_settle.lua) does for one request.
local function enqueue_new(keys, g, a, n, out, ttl, gen)
  local dups = 0
  local expire_at = (gen + 2) * ttl
  local function new_in_seen_set(bucket, member)
    if bucket == 0 then return true end
    if ttl == 0 then return redis.call('SADD', KEYS[bucket], member) == 1 end
    if redis.call('SISMEMBER', KEYS[bucket + 1], member) == 1 then return false end
    if redis.call('SADD', KEYS[bucket], member) == 0 then return false end
    redis.call('PEXPIREAT', KEYS[bucket], expire_at)
    return true
  end
  local groups, order_of, lanes, lane_set = {}, {}, {}, {}
  local rid = g.last_rid
  local specs = a + 1  -- the argument groups: spec i at specs + 4 (i - 1)
  a = specs + 4 * tonumber(ARGV[a])
  for _ = 1, n do
    if new_in_seen_set(tonumber(ARGV[a]), ARGV[a + 1]) then
      rid = rid + 1
      local s = specs + 4 * (tonumber(ARGV[a + 2]) - 1)
      local priority, qi, lane, order = ARGV[s], tonumber(ARGV[s + 1]), ARGV[s + 2], ARGV[s + 3]
      local left = order == 'L' or order == 'T'
      local id = (left and 'L' or 'R') .. qi
      local group = groups[id]
      if not group then
        group = {qi = qi, left = left, priority = priority, start = order == 'S' or order == 'T',
          envs = {}}
        groups[id] = group
        order_of[#order_of + 1] = id
      end
      group.envs[#group.envs + 1] = make_envelope(int_str(rid), '0', '0', priority, lane,
        ARGV[a + 3])
      if not lane_set[lane] then
        lane_set[lane] = true
        lanes[#lanes + 1] = '0'
        lanes[#lanes + 1] = lane
      end
      out[#out + 1] = 1
    else
      out[#out + 1] = 0
      dups = dups + 1
    end
    a = a + 4
  end
  local queued = rid - g.last_rid
  if queued > 0 then
    g.last_rid = rid
    redis.call('SET', g.rids, int_str(rid))
    for _, id in ipairs(order_of) do
      local group = groups[id]
      local q = lane_queue(group.qi)
      local pushed = redis.call(group.left and 'LPUSH' or 'RPUSH', q.l, unpack(group.envs))
      if pushed == #group.envs and (group.start or tonumber(group.priority) ~= 0) then
        redis.call('ZADD', q.idx, tier_rank(group.priority, group.start),
          tier_code(group.priority, group.start))
      end
    end
    redis.call('ZADD', keys.lanes, 'NX', unpack(lanes))
    local queued_arg = int_str(queued)
    redis.call('INCRBY', keys.todo, queued_arg)
    redis.call('HINCRBY', keys.stats, 'enqueued', queued_arg)
  end
  if dups > 0 then redis.call('HINCRBY', keys.stats, 'duplicates', int_str(dups)) end
  return a
end
