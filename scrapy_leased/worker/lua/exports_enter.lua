#!lua flags=allow-oom
-- exports_enter: a worker that writes local feed files (FEEDS, -o/-O) records their
-- absolute paths in its registry entry, unless a live worker of the crawl on the same
-- host has recorded one of them (two processes appending to one file interleave their
-- bytes: feedexports.py). The check and the record are one script, so two workers
-- opening at once cannot both miss each other. On a collision the caller leaves the
-- registry (it registered in worker_enter.lua and is about to stop at open): nothing of
-- it stays behind. Runs when Redis is out of memory (allow-oom), like worker_enter.lua.
-- KEYS[1] workers      ZSET worker id -> last heartbeat (ms of Redis TIME)
-- KEYS[2] worker_info  HASH worker id -> JSON {"host", "pid", "exports": [path, ...], ...}
-- ARGV[1] worker id  ARGV[2] worker TTL ms (a heartbeat younger than this is alive)
-- ARGV[3] host  ARGV[4] the caller's worker info JSON (with its "exports")
-- ARGV[5] n, the number of paths  ARGV[6 .. 5+n] the paths
-- ARGV[6+n ..] worker ids not to take for alive (their process is gone: feedexports.py)
-- Returns 1: recorded; or {worker id, path, pid} of the live worker writing a path.
local me, ttl, host = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local n = tonumber(ARGV[5])
local mine = {}
for i = 6, 5 + n do mine[ARGV[i]] = true end
local ignored = {}
for i = 6 + n, #ARGV do ignored[ARGV[i]] = true end
local now = server_ms()
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local other = all[i]
  if other ~= me and not ignored[other] then
    local beat = redis.call('ZSCORE', KEYS[1], other)
    if beat and now - tonumber(beat) < ttl then
      local ok, info = pcall(cjson.decode, all[i + 1])
      if ok and type(info) == 'table' and info.host == host
          and type(info.exports) == 'table' then
        for _, path in ipairs(info.exports) do
          if mine[path] then
            redis.call('ZREM', KEYS[1], me)
            redis.call('HDEL', KEYS[2], me)
            return {other, path, tostring(info.pid or '?')}
          end
        end
      end
    end
  end
end
redis.call('ZADD', KEYS[1], now, me)
redis.call('HSET', KEYS[2], me, ARGV[4])
return 1
