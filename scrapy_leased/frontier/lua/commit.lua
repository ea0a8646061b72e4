#!lua
-- commit: one worker's batch of results, atomically and in this order:
--   1. enqueue new requests, each deduplicated and pushed as ONE decision;
--   2. add the worker's Scrapy stats deltas to the fleet stats (those of the claims
--      settled here: a claim is never settled before the stats of its processing);
--   3. ack finished claims (their children are already queued by step 1);
--   4. fail claims (attempt +1, requeue at the back, or dead-letter).
-- KEYS[1] lanes  KEYS[2] todo  KEYS[3] stats  KEYS[4] leases
-- KEYS[5] inflight  KEYS[6] done  KEYS[7] dead  KEYS[8] rids (request id counter)
-- KEYS[9] throughput (HASH 10-second bucket -> requests newly done)
-- KEYS[10] owners (HASH claim token -> worker id: removed with each lease that ends)
-- KEYS[11] revisit (ZSET envelope -> due time in ms: revisit.lua queues it again then)
-- KEYS[12] fleet_stats (HASH: the fleet's Scrapy stats, fleet/stats.py)
-- KEYS[13] worker_acked (HASH worker id -> requests it acked: ARGV[9]'s count goes up by
--          this call's acks of held leases, one HINCRBY per call)
-- KEYS[14..] queue LISTs, by index below (a failed claim's followed by its lane's tier
--           index: lib_settle.lua lane_queue; the new requests': lib_enqueue.lua), and
--           the new requests' seen buckets (SETs of 64-bit integers; lib_enqueue.lua)
-- then the guard's four KEYS (lib_guard.lua: epoch, tokens, rids, this worker's commit
-- call key)
-- ARGV[1] n_enqueue  ARGV[2] n_ack  ARGV[3] n_fail  ARGV[4] max_attempts
-- ARGV[5] the seen set's expiry in ms (LEASED_SEEN_TTL; 0: none)  ARGV[6] the seen-set
-- generation the keys are for (lib_enqueue.lua)  ARGV[7] n_revisit  ARGV[8] n_stats
-- ARGV[9] the caller's worker id, whose count in worker_acked its acks raise ('': none)
-- then the n_enqueue new requests, in groups of the same lane, priority and order
--                   (lib_enqueue.lua: enqueue_new)
-- then n_ack     x {token, rid}
-- then n_fail    x {token, reason, permanent (0/1), index into KEYS of the LIST of
--                   the claim's regular tier in its lane (where a requeue goes), lane,
--                   rid, priority: the claim's (checked)}
-- then n_revisit x {token, interval in ms, priority, lane, payload}: the acks whose
--                   request is queued again that long after the ack (revisit.lua),
--                   attempts 0: from its envelope, or from these when its lease was lost
--                   meanwhile (its envelope is gone from inflight) and the ack marks it
--                   done (its requeued copy is then dropped as done, and would take the
--                   revisit with it)
-- then n_stats   x {op, stat name, value}: stats deltas (lib_stats.lua apply_stats),
--                   applied once per call id (a replayed call applies nothing)
-- then, optional (absent: none), n_drop and n_drop x {field, letter JSON}: requests a
--                   spider yielded that could not be stored (codec.PayloadError), each
--                   a dead letter at `field` of KEYS[7] (the letter's JSON object as
--                   given, with 'dropped' true, 'attempts' 0, 't' Redis time and its
--                   'reason' clipped; the same field again overwrites it); stats
--                   'dropped' counts them all, 'dead' the new letters
-- then the guard's four ARGV (call id, epoch, token, rid seen)
-- An ack or a fail settles a claim only if the claim still holds the request it names
-- (the envelope's rid). A stale ack (its lease is gone: the request was recovered) still
-- marks the rid done when the claim is of the current epoch (lib_guard.lua); a rid of an
-- earlier epoch may name another request since Redis went back, so it is not marked.
-- Returns {epoch, tokens, rids (lib_guard.lua),
--          enqueue results (1 queued, 0 duplicate)...,
--          ack results (bit 1: the lease was still held, bit 2: newly counted done)...,
--          fail results (2 dead-lettered, 1 requeued, 0 lease no longer held)...}
-- Errors, before changing anything, when a failed claim's lane or priority is not the
-- one given (its requeue would go to another lane's or tier's LIST),
-- and with 'SEEN_GENERATION <gen>' when the seen set's generation is not ARGV[6].
-- The counts and numbers a later step computes with are checked before any write (an
-- arithmetic on a nil would stop the script half-way, after the requests were queued).
for i = 1, 8 do
  if not tonumber(ARGV[i]) then
    return redis.error_reply('commit: ARGV[' .. i .. '] must be a number, not ' .. tostring(ARGV[i]))
  end
end
-- the dropped requests (after the stats, before the guard's four ARGV), read before any
-- write: a letter that is not a JSON object is an error
local groups, enqueue_error = enqueue_groups('commit', 10, tonumber(ARGV[1]),
  tonumber(ARGV[5]))
if enqueue_error then return enqueue_error end
local drop_at = groups.after + 2 * tonumber(ARGV[2])
  + 7 * tonumber(ARGV[3]) + 5 * tonumber(ARGV[7]) + 3 * tonumber(ARGV[8])
local drops = {}
if drop_at <= #ARGV - 4 then
  local n_drop = tonumber(ARGV[drop_at])
  if not n_drop or drop_at + 2 * n_drop ~= #ARGV - 4 then
    return redis.error_reply('commit: ARGV[' .. drop_at .. '] must be the number of dropped '
      .. 'requests that follow, not ' .. tostring(ARGV[drop_at]))
  end
  for i = 1, n_drop do
    local at = drop_at + 2 * i - 1
    local ok, letter = pcall(cjson.decode, ARGV[at + 1])
    if not ok or type(letter) ~= 'table' then
      return redis.error_reply('commit: the dropped request ' .. ARGV[at] .. ' is not a JSON '
        .. 'object')
    end
    drops[i] = {ARGV[at], letter}
  end
end
local ttl, gen = tonumber(ARGV[5]), tonumber(ARGV[6])
local gen_error = seen_gen_error(ttl, gen)
if gen_error then return gen_error end
local keys = {lanes = KEYS[1], todo = KEYS[2], stats = KEYS[3], dead = KEYS[7]}
local n_enq, n_ack, n_fail = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local max_attempts = tonumber(ARGV[4])
local fail_at = groups.after + 2 * n_ack
for a = fail_at - 2 * n_ack, fail_at - 1, 2 do
  if not tonumber(ARGV[a + 1]) then
    return redis.error_reply('commit: the rid of claim ' .. ARGV[a] .. ' must be a number, not '
      .. tostring(ARGV[a + 1]))
  end
end
local index_error = queue_index_error('commit', fail_at + 3, fail_at + 7 * n_fail - 1, 7)
if index_error then return index_error end
for i = 0, n_fail - 1 do
  local a = fail_at + 7 * i
  if not tonumber(ARGV[a + 6]) then
    return redis.error_reply('commit: the priority of claim ' .. ARGV[a] .. ' must be a '
      .. 'number, not ' .. tostring(ARGV[a + 6]))
  end
  local env = redis.call('HGET', KEYS[5], ARGV[a])
  if env then
    local rid, _, _, priority, lane = envelope_head(env)
    if rid and (ARGV[a + 5] == '' or rid == ARGV[a + 5]) then
      if lane ~= ARGV[a + 4] then
        return redis.error_reply('commit: claim ' .. ARGV[a] .. ' is in lane ' .. lane ..
          ', not ' .. ARGV[a + 4])
      end
      if tier_code(priority) ~= tier_code(ARGV[a + 6]) then
        return redis.error_reply('commit: claim ' .. ARGV[a] .. ' has priority ' ..
          priority .. ', not ' .. ARGV[a + 6])
      end
    end
  end
end
local g = guard_open()
local replayed = guard_replayed(g)
if replayed then return replayed end
local out = {}
local revisit_of = {}
local revisit_at = fail_at + 7 * n_fail
local stats_at = revisit_at + 5 * tonumber(ARGV[7])
for i = revisit_at, stats_at - 1, 5 do
  revisit_of[ARGV[i]] = {ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], tonumber(ARGV[i + 1]) or 0}
end
local a = enqueue_new(keys, g, groups, out, ttl, gen)
-- never fails (lib_stats.lua): a value refused is skipped and counted, the rest applied
local stats_refused = apply_stats(KEYS[12], stats_at, stats_at + 3 * tonumber(ARGV[8]) - 1)
if stats_refused > 0 then redis.call('HINCRBY', KEYS[3], 'stats_refused', stats_refused) end
if #drops > 0 then
  local now, new = server_ms(), 0
  for _, d in ipairs(drops) do
    local letter = d[2]
    letter.reason = clip(tostring(letter.reason or ''), 2000)
    letter.attempts, letter.dropped, letter.t = 0, true, now
    new = new + redis.call('HSET', KEYS[7], d[1], cjson.encode(letter))
  end
  if new > 0 then redis.call('HINCRBY', KEYS[3], 'dead', new) end
  redis.call('HINCRBY', KEYS[3], 'dropped', #drops)
end
-- The acks, each decided in order as if alone (a token named twice is settled by its
-- first ack), with their reads and deletes sent once per call: the envelopes (HMGET)
-- and leases (ZMSCORE; a lone ack takes its ZREM's reply) of the claims named, then the
-- leases, envelopes and owners of the claims settled (ZREM, HDEL, HDEL) and the
-- revisits (one ZADD, in order). The done bits stay one SETBIT each: as cheap as a
-- BITFIELD of them up to ~8 rids, and a commit rarely acks more.
local now_ms  -- Redis TIME, read once when needed
local done_new, acked, untrusted = 0, 0, 0
local tokens = {}
for i = 0, n_ack - 1 do tokens[i + 1] = ARGV[a + 2 * i] end
local envs = batch_call('HMGET', KEYS[5], tokens, nil, true)
local scores = n_ack > 1 and batch_call('ZMSCORE', KEYS[4], tokens, nil, true)
local gone = {}  -- token -> 1: its lease ended in this call, 2: its envelope too
local zrem, hdel_env, hdel_owner, revisits = {}, {}, {}, nil
for i = 1, n_ack do
  local token, rid = tokens[i], ARGV[a + 1]
  local again = revisit_of[token]
  local revisit_ms = again and again[4] or 0
  local was = gone[token]
  local env = was ~= 2 and envs[i] or nil
  local held, trusted = 0, false
  local mine = env and envelope_head(env) == rid
  if (mine or not env) and not was then  -- its lease, if held, ends (one without an
    gone[token] = env and 2 or 1         -- envelope too)
    if not scores then
      held = redis.call('ZREM', KEYS[4], token)
    elseif scores[i] then
      held = 1
      zrem[#zrem + 1] = token
    end
  end
  if mine then
    hdel_env[#hdel_env + 1] = token
    hdel_owner[#hdel_owner + 1] = token
    trusted = true
    if revisit_ms > 0 then
      local _, _, _, priority, lane, payload = parse_envelope(env)
      now_ms, revisits = now_ms or server_ms(), revisits or {}
      revisits[#revisits + 1] = now_ms + revisit_ms
      revisits[#revisits + 1] = make_envelope(rid, 0, 0, priority, lane, payload)
      revisit_ms = 0  -- scheduled
    end
  elseif not env then
    if held == 1 then hdel_owner[#hdel_owner + 1] = token end
    trusted = not guard_before_epoch(g, token)
  end
  local newly_done = 0
  if not trusted then
    untrusted = untrusted + 1
  elseif tonumber(rid) <= MAX_BITMAP_RID then
    newly_done = 1 - redis.call('SETBIT', KEYS[6], rid, '1')
  else
    newly_done = held
  end
  if revisit_ms > 0 and newly_done == 1 and again then  -- a stale ack marking it done
    now_ms, revisits = now_ms or server_ms(), revisits or {}
    revisits[#revisits + 1] = now_ms + revisit_ms
    revisits[#revisits + 1] = make_envelope(rid, 0, 0, again[1], again[2], again[3])
  end
  done_new = done_new + newly_done
  out[#out + 1] = held + 2 * newly_done
  acked = acked + held
  a = a + 2
end
batch_call('ZREM', KEYS[4], zrem)
batch_call('HDEL', KEYS[5], hdel_env)
batch_call('HDEL', KEYS[10], hdel_owner)
if revisits then batch_call('ZADD', KEYS[11], revisits) end
if acked > 0 then
  local acked_arg = int_str(acked)
  redis.call('HINCRBY', KEYS[3], 'acked', acked_arg)
  if ARGV[9] ~= '' then redis.call('HINCRBY', KEYS[13], ARGV[9], acked_arg) end
end
if untrusted > 0 then redis.call('HINCRBY', KEYS[3], 'acked_earlier_epoch', untrusted) end
if done_new > 0 then
  local done_arg = int_str(done_new)
  redis.call('HINCRBY', KEYS[3], 'done', done_arg)
  now_ms = now_ms or server_ms()
  local bucket = math.floor(now_ms / 10000)
  -- a new bucket (its count is this call's): keep the last 7 (admin.py reads 6). Only
  -- this script writes the HASH, so it grows past 7 only when a bucket is new.
  if redis.call('HINCRBY', KEYS[9], int_str(bucket), done_arg) == done_new
      and redis.call('HLEN', KEYS[9]) > 7 then
    for _, b in ipairs(redis.call('HKEYS', KEYS[9])) do
      local n = tonumber(b)
      if not n or n < bucket - 6 or n > bucket then redis.call('HDEL', KEYS[9], b) end
    end
  end
end
if n_fail > 0 then
  now_ms = now_ms or server_ms()
  local now = now_ms
  local failed = 0
  for _ = 1, n_fail do
    local token, rid = ARGV[a], ARGV[a + 5]
    local env = redis.call('HGET', KEYS[5], token)
    if env and (rid == '' or envelope_head(env) == rid)
        and redis.call('ZREM', KEYS[4], token) == 1 then
      redis.call('HDEL', KEYS[5], token)
      redis.call('HDEL', KEYS[10], token)
      failed = failed + 1
      out[#out + 1] = 1 + settle_failure(keys, lane_queue(tonumber(ARGV[a + 3])), env, ARGV[a + 1],
        max_attempts, ARGV[a + 2] == '1', now, 0)
    else
      if not env and redis.call('ZREM', KEYS[4], token) == 1 then
        redis.call('HDEL', KEYS[10], token)
      end
      out[#out + 1] = 0
    end
    a = a + 7
  end
  if failed > 0 then redis.call('HINCRBY', KEYS[3], 'failed', failed) end
end
return guard_reply(g, out)
