#!lua
-- key_aside: move a key of the wrong type out of the way. Outsiders write two keys of a
-- crawl: the feed (producers: RPUSH) and the control state (`scrapy leased pause`,
-- resume, stop). A producer that used XADD, SET, SADD, ... on the feed, or a person
-- who SET the control key by hand, leaves a key no script can use: the feed could never
-- be drained (the crawl never ends), the claims could not read the control state. The
-- first worker that meets it renames it, whole, to KEYS[2] (keys.py: feed_wrongtype,
-- control_wrongtype): nothing written is deleted, and the key works again at once
-- (an absent control state is `running`).
-- KEYS[1] the key (the feed: a LIST when right; the control state: a HASH)
-- KEYS[2] where to move it: <name>:wrongtype:<ms>, a name made of Redis TIME in ms
-- ARGV[1] the type KEYS[1] must hold (a TYPE name: list, hash)
-- Returns {type of KEYS[1] before, moved}: moved 1 when renamed; 0 when KEYS[1] holds
-- ARGV[1] or is absent (nothing to do: fixed meanwhile, or another worker moved it); -1
-- when KEYS[2] exists already (nothing done: the caller asks again with a new name).
local t = redis.call('TYPE', KEYS[1])
if type(t) == 'table' then t = t.ok end
if t == 'none' or t == ARGV[1] then return {t, 0} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {t, -1} end
redis.call('RENAME', KEYS[1], KEYS[2])
return {t, 1}
