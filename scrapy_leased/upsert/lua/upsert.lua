#!lua
-- upsert: write item records, each one unless a newer claim already wrote its key
-- (fencing: claim tokens only grow, so an older token means a stale worker).
-- KEYS[1..] record hashes (HASH key -> record JSON), one per item type in the batch
-- ARGV[1] n, the number of records
-- then n x {index of the record's hash in KEYS, key, fence token (0 = unfenced),
--           item type as a JSON string, item as JSON}
-- A stored record is '{"fence":<token>,"updated":<ms of Redis TIME>,"type":<type>,
-- "item":<item>}', the fence first so it is read without decoding the item.
-- A fenced write is applied when its token >= the stored one (equal: the same claim
-- again); an unfenced write is always applied and keeps the stored token.
-- Returns {1 (written) or 0 (rejected as stale), ...}, one per record, in order.
local t = redis.call('TIME')
local now = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
local out = {}
local a = 2
for i = 1, tonumber(ARGV[1]) do
  local hash, key, fence = KEYS[tonumber(ARGV[a])], ARGV[a + 1], ARGV[a + 2]
  local cur = redis.call('HGET', hash, key)
  local stored = cur and string.match(cur, '^{"fence":(%d+),') or '0'
  if fence ~= '0' and tonumber(fence) < tonumber(stored) then
    out[i] = 0
  else
    if tonumber(stored) > tonumber(fence) then fence = stored end
    redis.call('HSET', hash, key, '{"fence":' .. fence .. ',"updated":' .. now ..
      ',"type":' .. ARGV[a + 3] .. ',"item":' .. ARGV[a + 4] .. '}')
    out[i] = 1
  end
  a = a + 5
end
return out
