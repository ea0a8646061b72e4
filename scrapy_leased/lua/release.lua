-- release: a worker closing gracefully gives back claims it never started. They go
-- to the FRONT of their priority in their lane (they were at the front when claimed)
-- and no attempt is counted. The worker leaves the registry.
-- KEYS[1] seq  KEYS[2] lanes  KEYS[3] todo  KEYS[4] stats  KEYS[5] leases
-- KEYS[6] inflight  KEYS[7] workers  KEYS[8] worker_info  KEYS[9..] lane queues
-- ARGV[1] worker id ('' = none), then pairs {token, index into KEYS of its lane's queue}
-- Returns the number of requests released.
local keys = {seq = KEYS[1], lanes = KEYS[2], todo = KEYS[3]}
local released = 0
for i = 2, #ARGV, 2 do
  if redis.call('ZREM', KEYS[5], ARGV[i]) == 1 then
    local env = redis.call('HGET', KEYS[6], ARGV[i])
    redis.call('HDEL', KEYS[6], ARGV[i])
    local rid, _, _, priority, lane = parse_envelope(env)
    if rid then
      queue_push(keys, KEYS[tonumber(ARGV[i + 1])], lane, env, priority, true, tonumber(rid))
      released = released + 1
    end
  end
end
if released > 0 then redis.call('HINCRBY', KEYS[4], 'released', released) end
if ARGV[1] ~= '' then
  redis.call('ZREM', KEYS[7], ARGV[1])
  redis.call('HDEL', KEYS[8], ARGV[1])
end
return released
