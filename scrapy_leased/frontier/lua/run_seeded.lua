-- run_seeded: the seeding worker exhausted start(); later joiners of the run skip it
-- for good. Nothing changes when another worker seeds the run now.
-- KEYS[1] run  STRING  seeder's worker id, or 'seeded'
-- ARGV[1] worker id  ARGV[2] run marker expiry ms
-- Returns 1 when marked, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], 'seeded', 'PX', ARGV[2])
  return 1
end
return 0
