#!lua flags=allow-oom
-- worker_enter: a worker starting under an id it drew registers it, unless a live
-- worker has that id (then it draws another one: frontier/workerid.py). The check comes
-- before the write: under an id in use nothing is written. Runs when Redis is out of
-- memory (allow-oom), like renew.lua, which writes the same registry entry.
-- KEYS[1] workers  ZSET  worker id -> last heartbeat (ms of Redis TIME)
-- ARGV[1] worker id  ARGV[2] worker TTL ms (a heartbeat younger than this is alive)
-- Returns 1: registered (its heartbeat is now); 0: a live worker has the id.
local now = server_ms()
local beat = redis.call('ZSCORE', KEYS[1], ARGV[1])
if beat and now - tonumber(beat) < tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
return 1
