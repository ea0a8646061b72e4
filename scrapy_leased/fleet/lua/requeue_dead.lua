#!lua
-- requeue_dead: put dead letters back in the queue of their lane, attempts and
-- expiries reset to 0, at the back of their priority (a fresh sequence number): the
-- way commit.lua queues a new request (queue_push, lib_settle.lua). The request keeps
-- its rid, so the done bitmap still counts it once. Each letter is removed from the
-- dead letters in the same step.
-- KEYS[1] lanes  KEYS[2] todo  KEYS[3] stats  KEYS[4] dead  KEYS[5] done
-- KEYS[6..] queue LISTs, each followed by its lane's tier index (lib_settle.lua
-- lane_queue), referred to by index below
-- ARGV: n x {rid (field of the dead HASH), index in KEYS of the LIST of the regular tier
-- of its priority in its lane, lane, priority}
-- Returns {requeued, missing (no such dead letter any more), already done (their
-- request was processed meanwhile: the letter is dropped), unreadable (not an
-- envelope of the given lane and priority: the letter is kept)}.
-- stats 'requeued_dead' counts the requeued letters.
-- checked before any write: the queue indexes and the priorities (tier_code)
local err = queue_index_error('requeue_dead', 2, #ARGV, 4)
if err then return err end
for a = 4, #ARGV, 4 do
  if not tonumber(ARGV[a]) then
    return redis.error_reply('requeue_dead: ARGV[' .. a .. '] is not a priority: ' .. tostring(ARGV[a]))
  end
end
local keys = {lanes = KEYS[1], todo = KEYS[2]}
local requeued, missing, done, unreadable = 0, 0, 0, 0
for a = 1, #ARGV, 4 do
  local field, queue, want_lane = ARGV[a], lane_queue(tonumber(ARGV[a + 1])), ARGV[a + 2]
  local want_tier = tier_code(ARGV[a + 3])
  local raw = redis.call('HGET', KEYS[4], field)
  if not raw then
    missing = missing + 1
  else
    local ok, letter = pcall(cjson.decode, raw)
    local rid, priority, lane, payload
    if ok and type(letter) == 'table' and type(letter.envelope) == 'string' then
      local _a, _e
      rid, _a, _e, priority, lane, payload = parse_envelope(letter.envelope)
    end
    if not rid or lane ~= want_lane or tier_code(priority) ~= want_tier then
      unreadable = unreadable + 1
    elseif tonumber(rid) <= MAX_BITMAP_RID and redis.call('GETBIT', KEYS[5], rid) == 1 then
      redis.call('HDEL', KEYS[4], field)
      done = done + 1
    else
      queue_push(keys, queue, lane, make_envelope(rid, 0, 0, priority, lane, payload),
        priority, false)
      redis.call('HDEL', KEYS[4], field)
      requeued = requeued + 1
    end
  end
end
if requeued > 0 then redis.call('HINCRBY', KEYS[3], 'requeued_dead', requeued) end
return {requeued, missing, done, unreadable}
