-- Shared envelope helpers, prepended by Python (scripts.py) to every script that reads
-- or writes a stored request. Not a script on its own; the only place an envelope is
-- built or split in Lua (Python reads it with envelope.py).
--
-- An envelope is "<rid>|<attempts>|<expiries>|<priority>|<lane>|<payload>":
--   rid       request id, fixed at first enqueue (the done bitmap's offset)
--   attempts  failed or expired processing attempts so far
--   expiries  how many of those were lease expiries (its worker died while holding it:
--             workers process such a request alone, so a crash is charged to the
--             request that causes it, not to those that happened to be in flight)
--   priority  Scrapy priority (integer)
--   lane      the lane whose queue holds it (no '|'; '' is the default lane)
--   payload   the request as JSON (opaque here)

-- The six fields of an envelope (strings), or nil when it is malformed.
local function parse_envelope(env)
  return string.match(env, '^(%d+)|(%d+)|(%d+)|(%-?%d+)|([^|]*)|(.*)$')
end

-- The first five fields of an envelope (strings), or nil when it is malformed: the same
-- test as parse_envelope (its payload pattern matches anything), without the copy of
-- the payload (a claim and an ack check only the rid and counts: about 7,500 Redis
-- instructions a parse_envelope, 2,200 this).
local function envelope_head(env)
  return string.match(env, '^(%d+)|(%d+)|(%d+)|(%-?%d+)|([^|]*)|')
end

-- The envelope of a request: see above for the fields.
local function make_envelope(rid, attempts, expiries, priority, lane, payload)
  return rid .. '|' .. attempts .. '|' .. expiries .. '|' .. priority .. '|' .. lane .. '|'
    .. payload
end
