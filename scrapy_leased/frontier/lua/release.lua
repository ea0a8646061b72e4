#!lua flags=allow-oom
-- release: a worker gives back claims it never started: when closing gracefully (it
-- leaves the registry), or while it runs (claims its throttled download slot would not
-- start soon, _claimsize.py: it stays in the registry). They go to the FRONT of their
-- priority in their lane (they were at the front when claimed), in the order they were
-- first queued (by rid), and no attempt is counted.
-- Only the caller's own claims are released: a token whose owner (the `owners` HASH)
-- is another worker, or that has no owner, is left alone and not counted.
-- KEYS[1] lanes  KEYS[2] todo  KEYS[3] stats  KEYS[4] leases
-- KEYS[5] inflight  KEYS[6] workers  KEYS[7] worker_info  KEYS[8] owners (HASH claim
-- token -> worker id)  KEYS[9] worker_acked (HASH worker id -> requests it acked:
-- commit.lua)  KEYS[10..] queue LISTs, each followed by its lane's tier index
-- (lib_settle.lua lane_queue)
-- ARGV[1] worker id ('' = none: nothing is released), ARGV[2] '1': the worker leaves
-- the registry (its info and ack count go with it), '0': it stays, then pairs {token, index into KEYS of the LIST of the
-- regular tier of its envelope's priority in its lane (the caller read the envelopes)}
-- Returns the number of requests released.
local err = queue_index_error('release', 4, #ARGV, 2)  -- before any write
if err then return err end
local keys = {lanes = KEYS[1], todo = KEYS[2]}
local back = {}
for i = 3, #ARGV, 2 do
  if ARGV[1] ~= '' and redis.call('HGET', KEYS[8], ARGV[i]) == ARGV[1]
      and redis.call('ZREM', KEYS[4], ARGV[i]) == 1 then
    redis.call('HDEL', KEYS[8], ARGV[i])
    local env = redis.call('HGET', KEYS[5], ARGV[i])
    redis.call('HDEL', KEYS[5], ARGV[i])
    local rid, priority, lane
    if env then
      local _a, _e
      rid, _a, _e, priority, lane = envelope_head(env)
    end
    if rid then
      back[#back + 1] = {rid = tonumber(rid), env = env, priority = priority, lane = lane,
        q = lane_queue(tonumber(ARGV[i + 1]))}
    end
  end
end
-- Highest rid first: each push to the front goes before the one pushed before it.
table.sort(back, function(x, y) return x.rid > y.rid end)
for _, b in ipairs(back) do
  queue_push(keys, b.q, b.lane, b.env, b.priority, true)
end
if #back > 0 then redis.call('HINCRBY', KEYS[3], 'released', #back) end
if ARGV[1] ~= '' and ARGV[2] == '1' then
  redis.call('ZREM', KEYS[6], ARGV[1])
  redis.call('HDEL', KEYS[7], ARGV[1])
  redis.call('HDEL', KEYS[9], ARGV[1])
end
return #back
