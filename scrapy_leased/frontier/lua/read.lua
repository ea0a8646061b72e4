-- read: several read-only commands run atomically, with Redis server time: the
-- consistent view MULTI/EXEC gives, as one script, so it also runs on Redis Cluster
-- (redis-py's cluster client cannot put TIME in a transaction). Changes nothing.
-- KEYS[1..]  the keys read (a crawl's keys: one {hash tag}, one cluster slot)
-- ARGV[1]    number of commands n, then per command:
--            name (GET, HLEN, HGETALL, HMGET, HVALS, LLEN, ZCARD, ZMSCORE, ZRANGE), index of
--            its key in KEYS, number of further arguments c, those c arguments
-- Returns {seconds, microseconds, reply 1, ..., reply n}; HGETALL and ZRANGE
-- ... WITHSCORES replies are flat arrays, missing values false (nil).
local READ = {GET = true, HLEN = true, HGETALL = true, HMGET = true, HVALS = true, LLEN = true,
              ZCARD = true, ZMSCORE = true, ZRANGE = true}
local out = redis.call('TIME')
local i = 2
for _ = 1, tonumber(ARGV[1]) do
  local name, key, c = ARGV[i], KEYS[tonumber(ARGV[i + 1])], tonumber(ARGV[i + 2])
  if not READ[name] then
    return redis.error_reply('read.lua: ' .. tostring(name) .. ' is not one of its read commands')
  end
  out[#out + 1] = redis.call(name, key, unpack(ARGV, i + 3, i + 2 + c))
  i = i + 3 + c
end
return out
