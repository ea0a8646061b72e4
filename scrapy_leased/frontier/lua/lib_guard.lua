-- Shared guards of the scripts that hand out, renew or settle claims (claim.lua,
-- commit.lua, recover.lua, renew.lua), prepended by Python. Not a script on its own.
--
-- 1. Epochs. Redis may come back older than the state the workers saw: restarted from
--    an fsync-everysec AOF or an RDB, or failed over to a replica that lagged. A new
--    epoch starts when Redis runs with another run id than the one the epoch was
--    started for (a restart, a failover), or when the caller has seen an epoch, a token
--    or a request id (rid) that Redis no longer has (where INFO is disabled, only the
--    latter tells). The epoch's number is the first token issued in it.
--    Tokens are never issued twice: each one is above the last one issued, above every
--    token the caller saw, and at least Redis TIME in microseconds, so the tokens issued
--    after a rollback exceed every token issued before it (this assumes a server clock
--    that never goes back by more than a restart or a failover takes: NTP-synchronised
--    machines). Rids stay dense (they are offsets in the done bitmap): the counter is
--    raised past the highest rid the caller saw, and a rid named by a claim of an
--    earlier epoch (a token below the epoch) may name another request now: it is trusted
--    only while that claim is still held. The tokens key is written once per call
--    (guard_flush), before the first write that names a token issued in it: were the
--    script to stop half-way, the key is never below a token Redis holds.
-- 2. Replays. A call may carry an id; its reply is then kept under the caller's call key
--    (CrawlKeys.call) for CALL_TTL_MS, and the same call sent again (its reply was lost,
--    the client resent it) is answered from there without running again. An id starting
--    with '?' only asks for a recorded reply: without one, nothing is changed.
-- The guard's KEYS are the last four of the script: epoch HASH, tokens STRING, rids
-- STRING, call key (any key when there is no call id); its ARGV the last four: call id
-- ('' = none), then the highest epoch, token and rid the caller has seen (0 = none).
-- A guarded script's reply starts with {epoch, tokens, rids} as they are after the call.

local GUARD_KEYS, GUARD_ARGS = 4, 4
-- values unpack() may push (Lua's C stack holds ~8,000): lib_batch.lua's BATCH_ARGS is
-- the same bound, defined apart as renew.lua has this file without lib_batch.lua and
-- expired.lua lib_batch.lua without this one
local UNPACK_MAX = 4000
local CALL_TTL_MS = 600000

local function int_str(n)
  return string.format('%d', n)
end

-- A number to pass to redis.call: Redis 7.0 turns a Lua number argument into text with
-- "%.17g" (about 4,000 instructions: glibc's floating-point path); an integer within
-- 2^53 takes the integer path of string.format instead (about a quarter of that).
-- Other numbers (fractions, huge ones) are passed as they are.
local function num_arg(n)
  if n == math.floor(n) and n < 9007199254740992 and n > -9007199254740992 then
    return string.format('%d', n)
  end
  return n
end

local function guard_now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- A new token: above the last one, above what the caller saw, at least now in µs
-- (Redis TIME, read once per call). The tokens key is written by guard_flush, once
-- per call: a script calls it before its first write that holds a token issued here
-- (guard_reply calls it too), so the key never falls behind a token Redis holds.
local function guard_token(g)
  g.now_us = g.now_us or guard_now_us()
  local t = math.max(g.last_token + 1, g.seen_t + 1, g.now_us)
  g.last_token = t
  g.token_unsaved = true
  return t
end

-- Write the last token issued to the tokens key, if it was not written yet.
local function guard_flush(g)
  if g.token_unsaved then
    redis.call('SET', g.tokens, int_str(g.last_token))
    g.token_unsaved = false
  end
end

local function guard_open()
  local nk, na = #KEYS, #ARGV
  local g = {epoch = KEYS[nk - 3], tokens = KEYS[nk - 2], rids = KEYS[nk - 1], call = KEYS[nk],
    id = ARGV[na - 3], seen_e = tonumber(ARGV[na - 2]) or 0,
    seen_t = tonumber(ARGV[na - 1]) or 0, seen_r = tonumber(ARGV[na]) or 0, new = false}
  local ok, info = pcall(redis.call, 'INFO', 'server')
  local run = ''
  if ok and type(info) == 'string' then
    -- a plain find of the field, then its value: a pattern search from the start of
    -- INFO's text tries every position (about half of what INFO itself costs)
    local at = string.find(info, 'run_id:', 1, true)
    run = at and string.match(info, '^%w+', at + 7) or ''
  end
  local stored = redis.call('HMGET', g.epoch, 'e', 'run')
  local e = tonumber(stored[1])
  g.last_token = tonumber(redis.call('GET', g.tokens) or 0) or 0
  g.last_rid = tonumber(redis.call('GET', g.rids) or 0) or 0
  if not e or stored[2] ~= run or g.seen_e > e or g.seen_t > g.last_token
      or g.seen_r > g.last_rid then
    if g.seen_r > g.last_rid then
      g.last_rid = g.seen_r
      redis.call('SET', g.rids, int_str(g.seen_r))
    end
    e = guard_token(g)
    guard_flush(g)
    redis.call('HSET', g.epoch, 'e', int_str(e), 'run', run)
    g.new = true
  end
  g.e = e
  if g.id ~= '' then
    g.replay_only = string.sub(g.id, 1, 1) == '?'
    if g.replay_only then g.id = string.sub(g.id, 2) end
    local v = redis.call('GET', g.call)
    if v and string.sub(v, 1, #g.id + 1) == g.id .. ' ' then
      g.replayed = cmsgpack.unpack(string.sub(v, #g.id + 2))
    end
  end
  return g
end

-- A new request id (dense: the done bitmap's offsets).
local function guard_rid(g)
  g.last_rid = redis.call('INCR', g.rids)
  return g.last_rid
end

-- Whether a claim token was issued before the current epoch began.
local function guard_before_epoch(g, token)
  return tonumber(token) < g.e
end

-- The script's reply: {epoch, tokens, rids, out...}; `record` (out when nil) recorded
-- under the call id: a script that records less than its reply rebuilds the reply from
-- it on a replay (g.replayed is the record then; claim.lua).
local function guard_reply(g, out, record)
  guard_flush(g)
  if g.id ~= '' and not g.replayed and not g.replay_only then
    redis.call('SET', g.call, g.id .. ' ' .. cmsgpack.pack(record or out), 'PX', CALL_TTL_MS)
  end
  local e, t, r = int_str(g.e), int_str(g.last_token), int_str(g.last_rid)
  local n = #out
  -- one constructor: unpack pushes out's values in C and the table is sized once (a
  -- copy value by value grows it step by step: about 590 Redis instructions a value,
  -- 190 this); unpack is bounded by Lua's C stack, so a longer reply is copied
  if n <= UNPACK_MAX then return {e, t, r, unpack(out, 1, n)} end
  local reply = {e, t, r}
  for i = 1, n do reply[i + 3] = out[i] end
  return reply
end

-- Call at the start of a guarded script, after guard_open: the reply to return at
-- once (a replay, or nothing for a replay-only call without a recorded reply), or nil.
local function guard_replayed(g)
  if g.replayed then return guard_reply(g, g.replayed) end
  if g.replay_only then return guard_reply(g, {}) end
  return nil
end
