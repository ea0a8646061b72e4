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

-- The new requests' ARGV (enqueue_new), from a: {g, kq, then g groups x {priority,
-- lane, queue order code (lib_settle.lua: L, F, S or T), count}, then the requests,
-- group after group (count each, in the groups' order), x {member ('' for a request
-- that is not deduplicated), payload}}. KEYS from kq on: each group's LIST of its tier
-- in its lane followed by the lane's tier index (lib_settle.lua lane_queue), in the
-- groups' order, then the seen buckets, one per deduplicated request in the order
-- sent (with an expiry two: the current generation's SET, then the previous one's).
-- What requests share (lane, priority, order) is sent once per group, and where their
-- keys are by their order: an argument costs Redis about as much as a short command
-- (parsed, then made a Lua string), a number in it a tonumber more.
-- enqueue_args_len: how many ARGV that is.
local function enqueue_args_len(a, n)
  return 2 + 4 * tonumber(ARGV[a]) + 2 * n
end

-- The groups of the new requests' ARGV from a (above), read once, before any write:
-- {{priority, index in KEYS of its queue, lane, order, count}..., kb = index in KEYS of
-- the first seen bucket}, or nil and an error reply when their counts do not add up to
-- n (that would shift every argument after them) or a queue or a seen bucket is not in
-- KEYS (a SADD would stop the script after those before it: URLs marked seen, never
-- queued).
local function enqueue_groups(script, a, n, ttl)
  local n_groups, kq = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  if not n_groups or not kq or n_groups < 0 or n_groups ~= math.floor(n_groups) or kq < 1
      or kq ~= math.floor(kq) or kq + 2 * n_groups - 1 > #KEYS then
    return nil, redis.error_reply(script .. ': ARGV[' .. a .. '], ARGV[' .. (a + 1) .. '] must '
      .. 'be the number of request groups and the index in KEYS of their queues, not '
      .. tostring(ARGV[a]) .. ', ' .. tostring(ARGV[a + 1]))
  end
  local groups, total = {}, 0
  for s = a + 2, a + 1 + 4 * n_groups, 4 do
    local count = tonumber(ARGV[s + 3])
    if not count or count < 0 or count ~= math.floor(count) then
      return nil, redis.error_reply(script .. ': ARGV[' .. (s + 3) .. '] must be the count of '
        .. 'a request group, not ' .. tostring(ARGV[s + 3]))
    end
    groups[#groups + 1] = {ARGV[s], kq + 2 * #groups, ARGV[s + 1], ARGV[s + 2], count}
    total = total + count
  end
  local kb = kq + 2 * n_groups
  local first = a + 2 + 4 * n_groups
  if total ~= n or first + 2 * total - 1 > #ARGV then
    return nil, redis.error_reply(script .. ': the request groups hold ' .. total
      .. ' requests, not ' .. tostring(n) .. ', or ARGV ends before them')
  end
  local deduped = 0
  for m = first, first + 2 * total - 2, 2 do
    if ARGV[m] ~= '' then deduped = deduped + 1 end
  end
  if kb + (ttl > 0 and 2 or 1) * deduped - 1 > #KEYS then
    return nil, redis.error_reply(script .. ': the seen buckets of ' .. deduped .. ' requests '
      .. 'from KEYS[' .. kb .. '] are not all in KEYS')
  end
  groups.kb = kb
  return groups
end

-- enqueue_new(keys, g, a, groups, out, ttl, gen): queue the new requests whose ARGV
-- start at a (above), in their groups (enqueue_groups). Each is deduplicated (SADD to its seen bucket) and pushed as ONE
-- decision, with a new rid. Appends 1 (queued) or 0 (duplicate) per request to out;
-- counts stats 'enqueued' and 'duplicates'. keys: {lanes, todo, stats}; g: the guard
-- (lib_guard.lua); ttl, gen: the seen set's expiry (ms, 0: none) and the generation
-- checked by seen_gen_error. Returns the index of the next ARGV.
-- Per call, not per request: the new requests' rids are counted here and the rids key
-- written once, before any of them is pushed (never below a rid in a queue, were the
-- script to stop half-way); one push per group (in the order given), one ZADD NX
-- of the lanes, one INCRBY of todo. As queue_push (lib_settle.lua) does for one request.
local function enqueue_new(keys, g, a, groups, out, ttl, gen)
  local dups = 0
  local expire_at = (gen + 2) * ttl
  local kb, width = groups.kb, ttl > 0 and 2 or 1
  local function new_in_seen_set(bucket, member)
    if ttl == 0 then return redis.call('SADD', KEYS[bucket], member) == 1 end
    if redis.call('SISMEMBER', KEYS[bucket + 1], member) == 1 then return false end
    if redis.call('SADD', KEYS[bucket], member) == 0 then return false end
    redis.call('PEXPIREAT', KEYS[bucket], expire_at)
    return true
  end
  local pushes, lanes, lane_set = {}, {}, {}
  local rid = g.last_rid
  a = a + 2 + 4 * #groups  -- the requests
  for _, group in ipairs(groups) do
    local priority, lane = group[1], group[3]
    local envs
    for _ = 1, group[5] do
      local new = true
      if ARGV[a] ~= '' then
        new = new_in_seen_set(kb, ARGV[a])
        kb = kb + width
      end
      if new then
        rid = rid + 1
        envs = envs or {}
        envs[#envs + 1] = make_envelope(int_str(rid), '0', '0', priority, lane, ARGV[a + 1])
        out[#out + 1] = 1
      else
        out[#out + 1] = 0
        dups = dups + 1
      end
      a = a + 2
    end
    if envs then
      group.envs = envs
      pushes[#pushes + 1] = group
      if not lane_set[lane] then
        lane_set[lane] = true
        lanes[#lanes + 1] = '0'
        lanes[#lanes + 1] = lane
      end
    end
  end
  local queued = rid - g.last_rid
  if queued > 0 then
    g.last_rid = rid
    redis.call('SET', g.rids, int_str(rid))
    for _, p in ipairs(pushes) do
      local order, envs = p[4], p.envs
      local q = lane_queue(p[2])
      local start = order == 'S' or order == 'T'
      local pushed = redis.call((order == 'L' or order == 'T') and 'LPUSH' or 'RPUSH', q.l,
        unpack(envs))
      if pushed == #envs and (start or p[1] ~= '0') then
        redis.call('ZADD', q.idx, tier_rank(p[1], start), tier_code(p[1], start))
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
