#!lua
-- revisit: queue again requests whose revisit is due (the `revisit` ZSET, filled by
-- commit.lua when a request with a revisit interval is acked). Each one is queued as a
-- new request (a new rid: processed and counted done again; attempts 0) of its
-- priority, FIFO at the back, in its lane; its entry leaves the ZSET in the same step,
-- so of several workers sweeping at once one queues it. The caller read the due entries
-- (with their lanes) beforehand; an entry gone or not due by now is skipped.
-- KEYS[1] lanes  KEYS[2] todo  KEYS[3] stats ('revisited' counts them)
-- KEYS[4] revisit  ZSET envelope -> due time (ms of Redis TIME)
-- KEYS[5..] queue LISTs, each followed by its lane's tier index (lib_settle.lua
-- lane_queue), by index below
-- then the guard's four KEYS (lib_guard.lua: epoch, tokens, rids, any key)
-- ARGV: n x {envelope (the member), index into KEYS of the LIST of the regular tier of
-- its priority in its lane}
-- then the guard's four ARGV (no call id)
-- Returns {epoch, tokens, rids (lib_guard.lua), number queued}
local keys = {lanes = KEYS[1], todo = KEYS[2], stats = KEYS[3]}
local err = queue_index_error('revisit', 2, #ARGV - GUARD_ARGS, 2)  -- before any write
if err then return err end
local g = guard_open()
local now = server_ms()
local queued = 0
for i = 1, #ARGV - GUARD_ARGS, 2 do
  local member = ARGV[i]
  local due = redis.call('ZSCORE', KEYS[4], member)
  if due and tonumber(due) <= now and redis.call('ZREM', KEYS[4], member) == 1 then
    local _, _, _, priority, lane, payload = parse_envelope(member)
    if priority then  -- (commit.lua stores well-formed envelopes only)
      local rid = guard_rid(g)
      queue_push(keys, lane_queue(tonumber(ARGV[i + 1])), lane,
        make_envelope(rid, 0, 0, priority, lane, payload), priority, false, 'F')
      queued = queued + 1
    end
  end
end
if queued > 0 then redis.call('HINCRBY', KEYS[3], 'revisited', queued) end
return guard_reply(g, {queued})
