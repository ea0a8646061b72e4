-- run_refresh: a live worker's heartbeat keeps the crawl's run going.
-- KEYS[1] run  STRING  seeder's worker id, or 'seeded'
-- ARGV[1] run marker expiry ms
-- Returns 1 when the run marker exists (its expiry was refreshed), else 0.
return redis.call('PEXPIRE', KEYS[1], ARGV[1])
