#!lua
-- feed_aside: move a feed key of the wrong type out of the way (feed/drain.py). A
-- producer that wrote the crawl's feed with XADD, SET, SADD, ... instead of RPUSH leaves
-- a key no worker can read, and the crawl could never end (the feed may hold work).
-- The first worker that meets it renames it, whole, to KEYS[2] (keys.py:
-- feed_wrongtype): nothing the producer wrote is deleted, and the feed takes RPUSH
-- entries again at once.
-- KEYS[1] feed                      the crawl's feed (a LIST when right)
-- KEYS[2] feed:wrongtype:<ms>       where to move it: a name made of Redis TIME in ms
-- Returns {type of KEYS[1] before, moved}: moved 1 when renamed; 0 when the feed is a
-- list or absent (nothing to do: fixed meanwhile, or another worker moved it); -1 when
-- KEYS[2] exists already (nothing done: the caller asks again with a new name).
local t = redis.call('TYPE', KEYS[1])
if type(t) == 'table' then t = t.ok end
if t == 'none' or t == 'list' then return {t, 0} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {t, -1} end
redis.call('RENAME', KEYS[1], KEYS[2])
return {t, 1}
