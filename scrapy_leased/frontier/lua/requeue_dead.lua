#!lua
-- requeue_dead: put dead letters back in the queue of their lane, attempts and
-- expiries reset to 0, at the back of their priority (a fresh sequence number): the
-- way commit.lua queues a new request (queue_push, lib_settle.lua). The request keeps
-- its rid, so the done bitmap still counts it once. Each letter is removed from the
-- dead letters in the same step.
-- KEYS[1] seq  KEYS[2] lanes  KEYS[3] todo  KEYS[4] stats  KEYS[5] dead  KEYS[6] done
-- KEYS[7..] lane queues (a ZSET, then its LIST), referred to by index below
-- ARGV: n x {rid (field of the dead HASH), index of its lane's queue ZSET in KEYS, lane}
-- Returns {requeued, missing (no such dead letter any more), already done (their
-- request was processed meanwhile: the letter is dropped), unreadable (not an
-- envelope of the given lane: the letter is kept)}.
-- stats 'requeued_dead' counts the requeued letters.
local keys = {seq = KEYS[1], lanes = KEYS[2], todo = KEYS[3]}
local requeued, missing, done, unreadable = 0, 0, 0, 0
for a = 1, #ARGV, 3 do
  local field, queue, want_lane = ARGV[a], lane_queue(tonumber(ARGV[a + 1])), ARGV[a + 2]
  local raw = redis.call('HGET', KEYS[5], field)
  if not raw then
    missing = missing + 1
  else
    local ok, letter = pcall(cjson.decode, raw)
    local rid, priority, lane, payload
    if ok and type(letter) == 'table' and type(letter.envelope) == 'string' then
      local _a, _e
      rid, _a, _e, priority, lane, payload = parse_envelope(letter.envelope)
    end
    if not rid or lane ~= want_lane then
      unreadable = unreadable + 1
    elseif tonumber(rid) <= MAX_BITMAP_RID and redis.call('GETBIT', KEYS[6], rid) == 1 then
      redis.call('HDEL', KEYS[5], field)
      done = done + 1
    else
      queue_push(keys, queue, lane, make_envelope(rid, 0, 0, priority, lane, payload),
        priority, false)
      redis.call('HDEL', KEYS[5], field)
      requeued = requeued + 1
    end
  end
end
if requeued > 0 then redis.call('HINCRBY', KEYS[4], 'requeued_dead', requeued) end
return {requeued, missing, done, unreadable}
