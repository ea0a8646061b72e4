#!lua
-- hot_keys: keep the crawl's busiest keys in Redis's hashed encodings. A HASH or ZSET
-- of up to 128 entries (hash-/zset-max-listpack-entries) is stored as a listpack, where
-- finding a field or member reads the entries one after another: these keys are read
-- or written by nearly every claim and commit, several times each (the lanes' times,
-- the leases, their envelopes and owners, the counters, the heartbeats); as hashtables
-- and skiplists a page costs Redis about 5 % fewer instructions
-- (bench_script_instructions.py, 64 lanes). A listpack given an entry longer than
-- hash-/zset-max-listpack-value becomes a hashtable or skiplist, and Redis does not
-- turn it back while the key exists: each of these keys that is a listpack is given a
-- long field or member that is removed at once (in this script: no reader sees it). A
-- key emptied and made again is a listpack again until the next call (the workers'
-- sweep, every LEASED_SWEEP_INTERVAL). The per-lane keys stay listpacks: they are
-- many, and small.
-- KEYS[1] lanes  KEYS[2] leases  KEYS[3] inflight  KEYS[4] owners  KEYS[5] stats
-- KEYS[6] fleet_stats  KEYS[7] control  KEYS[8] worker_acked  KEYS[9] throughput
-- KEYS[10] workers
-- Returns the number of keys converted (a key of another type, set by hand, is left
-- as it is).
local LONG = string.rep('~', 4096)  -- past any sensible *-max-listpack-value
local converted = 0
for _, key in ipairs(KEYS) do
  local encoding = redis.call('OBJECT', 'ENCODING', key)
  if encoding == 'listpack' or encoding == 'ziplist' then  -- (ziplist: Redis 6)
    local kind = redis.call('TYPE', key)['ok']
    if kind == 'hash' and redis.call('HEXISTS', key, LONG) == 0 then
      redis.call('HSET', key, LONG, '')
      redis.call('HDEL', key, LONG)
    elseif kind == 'zset' and not redis.call('ZSCORE', key, LONG) then
      redis.call('ZADD', key, 0, LONG)
      redis.call('ZREM', key, LONG)
    end
    if redis.call('OBJECT', 'ENCODING', key) ~= encoding then converted = converted + 1 end
  end
end
return converted
