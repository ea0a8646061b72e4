-- release: a worker closing gracefully gives back claims it never started. They go
-- to the FRONT of their priority (they were at the front when claimed) and no
-- attempt is counted. The worker leaves the registry.
-- KEYS[1] queue  KEYS[2] seq  KEYS[3] stats  KEYS[4] leases  KEYS[5] inflight
-- KEYS[6] workers  KEYS[7] worker_info
-- ARGV[1] worker id  ARGV[2..] claim tokens to release
-- Returns the number of requests released.
local released = 0
for i = 2, #ARGV do
  if redis.call('ZREM', KEYS[4], ARGV[i]) == 1 then
    local env = redis.call('HGET', KEYS[5], ARGV[i])
    redis.call('HDEL', KEYS[5], ARGV[i])
    local rid, _, _, priority = parse_envelope(env)
    if rid then
      queue_push(KEYS[1], KEYS[2], env, priority, true, tonumber(rid))
      released = released + 1
    end
  end
end
if released > 0 then redis.call('HINCRBY', KEYS[3], 'released', released) end
if ARGV[1] ~= '' then
  redis.call('ZREM', KEYS[6], ARGV[1])
  redis.call('HDEL', KEYS[7], ARGV[1])
end
return released
