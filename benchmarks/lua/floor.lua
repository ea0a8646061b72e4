-- floor (bench_script_instructions.py --floor): the fewest Redis commands a page needs,
-- in one script per batch of pages, with none of the frontier's guarantees beyond the
-- lease: the yardstick a frontier protocol's cost per page is compared with. Not used
-- by scrapy_leased.
-- One call acks the previous batch (SETBIT done per rid, its one lease entry and
-- envelope removed), queues the links that are new (SADD to their seen bucket, one
-- RPUSH of the new envelopes) and claims the next batch (one LPOP with a count, one
-- lease entry and one inflight field for the whole batch).
-- KEYS[1] queue LIST  KEYS[2] leases ZSET  KEYS[3] inflight HASH  KEYS[4] done BITMAP
-- KEYS[5] rids STRING  KEYS[6] stats HASH  KEYS[7..] seen buckets (SETs)
-- ARGV[1] pages to claim  ARGV[2] the previous batch's token ('' none)
-- ARGV[3] n acked  ARGV[4] n links, then n acked rids, then n links x {index into KEYS
-- of the link's seen bucket, fingerprint, payload}
-- Returns {token, envelopes claimed}
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n_ack, n_link = tonumber(ARGV[3]), tonumber(ARGV[4])
local a = 5
for _ = 1, n_ack do
  redis.call('SETBIT', KEYS[4], ARGV[a], 1)
  a = a + 1
end
if ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('HDEL', KEYS[3], ARGV[2])
end
local rid = tonumber(redis.call('GET', KEYS[5]) or 0)
local envs = {}
for _ = 1, n_link do
  if redis.call('SADD', KEYS[tonumber(ARGV[a])], ARGV[a + 1]) == 1 then
    rid = rid + 1
    envs[#envs + 1] = rid .. '|0|0|0||' .. ARGV[a + 2]
  end
  a = a + 3
end
if #envs > 0 then
  redis.call('SET', KEYS[5], rid)
  redis.call('RPUSH', KEYS[1], unpack(envs))
end
local got = redis.call('LPOP', KEYS[1], tonumber(ARGV[1]))
local token = string.format('%d', now_us)
if got then
  redis.call('ZADD', KEYS[2], math.floor(now_us / 1000) + 60000, token)
  redis.call('HSET', KEYS[3], token, table.concat(got, '\n'))
  redis.call('HINCRBY', KEYS[6], 'claimed', #got)
end
if n_ack > 0 then redis.call('HINCRBY', KEYS[6], 'acked', n_ack) end
return {token, got or {}}
