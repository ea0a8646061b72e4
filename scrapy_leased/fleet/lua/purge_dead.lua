#!lua flags=allow-oom
-- purge_dead: delete dead letters for good (the requests are not processed).
-- KEYS[1] dead   HASH rid -> dead letter (JSON)
-- KEYS[2] stats  HASH crawl counters ('purged_dead' counts the deleted letters)
-- ARGV[1..] rids (fields of the dead HASH) to delete; none: every dead letter
-- Returns the number of dead letters deleted.
local n
if #ARGV == 0 then
  n = redis.call('HLEN', KEYS[1])
  redis.call('DEL', KEYS[1])
else
  n = redis.call('HDEL', KEYS[1], unpack(ARGV))
end
if n > 0 then redis.call('HINCRBY', KEYS[2], 'purged_dead', n) end
return n
