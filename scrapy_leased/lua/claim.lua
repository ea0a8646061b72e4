-- claim: take up to N requests from the queue (highest priority first, FIFO within a
-- priority) and lease each one to this worker, in one atomic step.
-- KEYS[1] queue     ZSET  queued envelopes (see lib_settle.lua)
-- KEYS[2] leases    ZSET  claim token -> lease deadline (ms, Redis TIME)
-- KEYS[3] inflight  HASH  claim token -> envelope
-- KEYS[4] tokens    STRING  crawl-wide claim counter (fencing tokens, only grows)
-- KEYS[5] done      BITMAP  rid -> processed
-- KEYS[6] stats     HASH  crawl counters
-- KEYS[7] dead      HASH  rid -> dead letter (JSON)
-- KEYS[8] seq       STRING  queue order counter
-- KEYS[9] workers   ZSET  worker id -> last heartbeat (ms)
-- ARGV[1] max number of requests to claim (may be 0: only report counts)
-- ARGV[2] lease length in ms
-- ARGV[3] worker id (its heartbeat is refreshed)
-- Returns {now_ms, queued_after, leases_after, token1, envelope1, token2, envelope2, ...}.
-- Requests whose rid is already marked done (a stale copy requeued after its first
-- worker acked late) are dropped here and counted in stats 'skipped_done'.
-- A request whose lease expired before (expiries > 0: its worker died holding it) is
-- claimed only alone, as the first and only request of a call, so that a request that
-- crashes its worker does not take other claims down with it.
local keys = {queue = KEYS[1], stats = KEYS[6], dead = KEYS[7], seq = KEYS[8]}
local want = tonumber(ARGV[1])
local lease_ms = tonumber(ARGV[2])
local now = server_ms()
redis.call('ZADD', KEYS[9], now, ARGV[3])
local out = {now, 0, 0}
local got = 0
while got < want do
  local popped = redis.call('ZPOPMIN', KEYS[1], 1)
  if #popped == 0 then break end
  local env = string.sub(popped[1], 13)
  local rid, _, expiries = parse_envelope(env)
  if not rid then
    settle_failure(keys, popped[1], 'queue member is not an envelope', 1, true, now, 0)
  elseif tonumber(rid) <= MAX_BITMAP_RID and redis.call('GETBIT', KEYS[5], rid) == 1 then
    redis.call('HINCRBY', KEYS[6], 'skipped_done', 1)
  elseif expiries ~= '0' and got > 0 then
    redis.call('ZADD', KEYS[1], popped[2], popped[1])  -- a suspect goes alone: next call
    break
  else
    local token = redis.call('INCR', KEYS[4])
    redis.call('ZADD', KEYS[2], now + lease_ms, token)
    redis.call('HSET', KEYS[3], token, env)
    out[#out + 1] = token
    out[#out + 1] = env
    got = got + 1
    if expiries ~= '0' then break end
  end
end
if got > 0 then redis.call('HINCRBY', KEYS[6], 'claimed', got) end
out[2] = redis.call('ZCARD', KEYS[1])
out[3] = redis.call('ZCARD', KEYS[2])
return out
