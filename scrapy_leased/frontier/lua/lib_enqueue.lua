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

-- The new requests' ARGV (enqueue_new), from a: {g, kq, kb, then g groups x {lane,
-- spec}, then the requests, group after group (count each, in the groups' order),
-- x {member ('' for a request that is not deduplicated), payload}}. A group's spec is
-- count x 4 + its queue order (0 F, 1 L, 2 S, 3 T: lib_settle.lua's codes), a number,
-- followed by a space and the group's priority when that is not 0. KEYS from kq on:
-- each group's LIST of its tier in its lane (lib_settle.lua lane_queue), followed by
-- the lane's tier index only when the group's tier is not p0 (a start order or a
-- priority), in the groups' order; then from kb the seen buckets, one per
-- deduplicated request in the order sent (with an expiry two: the current
-- generation's SET, then the previous one's).
-- What requests share (lane, priority, order) is sent once per group, in two
-- arguments, with one key for most groups (regular requests of priority 0): an
-- argument costs Redis about as much as a short command (parsed, then made a Lua
-- string), a number in it a tonumber more.
local GROUP_ORDERS = {'F', 'L', 'S', 'T'}
local GROUP_WIDTH = 5

-- The groups of the new requests' ARGV from a (above), read once, before any write:
-- {priority, index in KEYS of its queue, lane, order, count, ... (GROUP_WIDTH values a
-- group, one table for all: a table each costs an allocation and the collector's work
-- on it), n = the number of groups, kb = index in KEYS of the first seen bucket,
-- first = index in ARGV of the first request, after = of the argument after the
-- last}, or nil and an error reply when a spec is not one, the
-- counts do not add up to n (that would shift every argument after them) or the queues
-- do not end at kb or a seen bucket is not in KEYS before the guard's (a SADD to the
-- wrong key, or past KEYS, would stop the script after those before it: URLs marked
-- seen, never queued).
local function enqueue_groups(script, a, n, ttl)
  local n_groups, kq, kb = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if not n_groups or not kq or not kb or n_groups < 0 or n_groups ~= math.floor(n_groups)
      or kq < 1 or kq ~= math.floor(kq) then
    return nil, redis.error_reply(script .. ': ARGV[' .. a .. '..' .. (a + 2) .. '] must be '
      .. 'the number of request groups and the indexes in KEYS of their queues and seen '
      .. 'buckets, not ' .. tostring(ARGV[a]) .. ', ' .. tostring(ARGV[a + 1]) .. ', '
      .. tostring(ARGV[a + 2]))
  end
  local groups, total, k = {}, 0, kq
  local s, j = a + 3, 1
  for _ = 1, n_groups do
    local spec, priority = tonumber(ARGV[s + 1]), '0'
    if not spec then
      local head, p = string.match(ARGV[s + 1], '^(%d+) (%-?%d+)$')
      spec, priority = tonumber(head), p
    end
    if not spec or spec % 1 ~= 0 or spec < 0 then  -- (% 1: no C call; nan fails too)
      return nil, redis.error_reply(script .. ': ARGV[' .. (s + 1) .. '] must be the spec of '
        .. 'a request group (count x 4 + order[ priority]), not ' .. tostring(ARGV[s + 1]))
    end
    local order = spec % 4
    local count = (spec - order) / 4
    groups[j], groups[j + 1], groups[j + 2] = priority, k, ARGV[s]
    groups[j + 3], groups[j + 4] = GROUP_ORDERS[order + 1], count
    j = j + GROUP_WIDTH
    total = total + count
    k = k + ((order >= 2 or priority ~= '0') and 2 or 1)
    s = s + 2
  end
  if k ~= kb then
    return nil, redis.error_reply(script .. ': the queues of ' .. n_groups .. ' request groups '
      .. 'from KEYS[' .. kq .. '] end at KEYS[' .. (k - 1) .. '], not before KEYS['
      .. tostring(kb) .. ']')
  end
  if total ~= n or s + 2 * total - 1 > #ARGV then
    return nil, redis.error_reply(script .. ': the request groups hold ' .. total
      .. ' requests, not ' .. tostring(n) .. ', or ARGV ends before them')
  end
  -- the seen buckets end before the guard's KEYS (lib_guard.lua); KEYS for every
  -- request's seen buckets are enough for those deduplicated: only when there are fewer
  -- (some requests are not deduplicated) are these counted
  local width, deduped, last = ttl > 0 and 2 or 1, total, #KEYS - GUARD_KEYS
  if kb + width * total - 1 > last then
    deduped = 0
    for m = s, s + 2 * total - 2, 2 do
      if ARGV[m] ~= '' then deduped = deduped + 1 end
    end
  end
  if kb + width * deduped - 1 > last then
    return nil, redis.error_reply(script .. ': the seen buckets of ' .. deduped .. ' requests '
      .. 'from KEYS[' .. kb .. '] are not all in KEYS')
  end
  groups.n, groups.kb, groups.first, groups.after = n_groups, kb, s, s + 2 * total
  return groups
end

-- enqueue_new(keys, g, groups, out, ttl, gen): queue the new requests of the groups
-- read by enqueue_groups (above). Each is deduplicated (SADD to its seen bucket) and pushed as ONE
-- decision, with a new rid. Appends 1 (queued) or 0 (duplicate) per request to out;
-- counts stats 'enqueued' and 'duplicates'. keys: {lanes, todo, stats}; g: the guard
-- (lib_guard.lua); ttl, gen: the seen set's expiry (ms, 0: none) and the generation
-- checked by seen_gen_error. Returns the index of the next ARGV (groups.after).
-- Per call, not per request: the new requests' rids are counted here and the rids key
-- written once, before any of them is pushed (never below a rid in a queue, were the
-- script to stop half-way); one push per group (in the order given), one ZADD NX
-- of the lanes, one INCRBY of todo. As queue_push (lib_settle.lua) does for one request.
local function enqueue_new(keys, g, groups, out, ttl, gen)
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
  local pushes, lanes, lane_set = {}, {}, {}  -- pushes: {group's index, its envelopes}...
  local rid = g.last_rid
  local a = groups.first
  for j = 1, groups.n * GROUP_WIDTH, GROUP_WIDTH do
    local priority, lane = groups[j], groups[j + 2]
    local envs
    for _ = 1, groups[j + 4] do
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
      pushes[#pushes + 1] = j
      pushes[#pushes + 1] = envs
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
    for i = 1, #pushes, 2 do
      local j, envs = pushes[i], pushes[i + 1]
      local priority, q, order = groups[j], groups[j + 1], groups[j + 3]
      local start = order == 'S' or order == 'T'
      local pushed = redis.call((order == 'L' or order == 'T') and 'LPUSH' or 'RPUSH', KEYS[q],
        unpack(envs))
      if pushed == #envs and (start or priority ~= '0') then  -- its tier index: KEYS[q + 1]
        redis.call('ZADD', KEYS[q + 1], tier_rank(priority, start), tier_code(priority, start))
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
