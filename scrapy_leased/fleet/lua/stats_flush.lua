#!lua
-- stats_flush: add one worker's Scrapy stats deltas (since its last flush) to the
-- crawl's fleet stats, once: a flush carries the worker's sequence number, and a flush
-- whose number is not above the last one applied (sent again after its reply was lost)
-- changes nothing. (Deltas that ride along with a commit are applied by commit.lua,
-- once per commit call.)
-- KEYS[1] fleet_stats  HASH stat name -> number
-- KEYS[2] stats_seq    STRING the worker's last flush applied (expires after ARGV[2] ms)
-- ARGV[1] sequence number of this flush (per worker, growing from 1)
-- ARGV[2] how long the sequence number is kept, ms
-- ARGV[3..] triples {op, stat name, value} (lib_stats.lua apply_stats)
-- Returns 1 when applied, 0 when it was applied before.
local seq = tonumber(ARGV[1])
if seq <= (tonumber(redis.call('GET', KEYS[2]) or '0') or 0) then return 0 end
apply_stats(KEYS[1], 3, #ARGV)
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
