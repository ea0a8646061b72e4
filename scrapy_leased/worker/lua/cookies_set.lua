#!lua
-- cookies_set: a worker's changes to one cookie jar of the crawl (cookies.py,
-- LeasedCookiesMiddleware: cookies set by a response, or by a request's `cookies`),
-- written for every worker of the crawl, in one step: every entry is checked first and
-- nothing is written when one is malformed; then the cookies are set and deleted, the
-- jar's expired cookies pruned (Redis TIME) and its version raised, so that the other
-- workers load the jar again: the control HASH's 'cookies' field is set to a value never
-- used before (Redis TIME in µs and the jar's new version), and every claim returns it
-- (lua/claim.lua), so a worker reads a jar's version again only when a claim shows that
-- some jar changed since it last read it.
-- KEYS[1] cookies:<jar>  HASH  field '<domain>\n<path>\n<name>' -> cookie JSON
--                               {"domain", "path", "name", "value", "expires", ...};
--                               field 'v' -> the jar's version
-- KEYS[2] control  HASH  the fleet's control state (keys.py); its field 'cookies' is set
-- ARGV[1] n, the number of cookies to set; ARGV[2 .. 2n+1] field, cookie JSON pairs;
-- ARGV[2n+2 ..] fields of cookies to delete
-- Returns {version, number of expired cookies pruned}, or the error
-- 'COOKIE_INVALID <argument index> <why>' (nothing written), or the wrong type of the
-- control key (lib_keys.lua; nothing written).
local VERSION = 'v'
local n = tonumber(ARGV[1])
if not n or n < 0 or 2 * n + 1 > #ARGV then
  return redis.error_reply('COOKIE_INVALID 1 bad count')
end

local function field_of(doc)
  return doc.domain .. '\n' .. doc.path .. '\n' .. doc.name
end

local function check_field(i, field)
  local _, newlines = string.gsub(field, '\n', '')
  if newlines ~= 2 then
    return 'COOKIE_INVALID ' .. i .. ' field is not domain, path and name'
  end
  return nil
end

local sets = {}
for i = 2, 2 * n, 2 do
  local field, text = ARGV[i], ARGV[i + 1]
  local bad = check_field(i, field)
  if bad then return redis.error_reply(bad) end
  local ok, doc = pcall(cjson.decode, text)
  if not ok or type(doc) ~= 'table' then
    return redis.error_reply('COOKIE_INVALID ' .. (i + 1) .. ' not a JSON object')
  end
  for _, name in ipairs({'domain', 'path', 'name'}) do
    if type(doc[name]) ~= 'string' then
      return redis.error_reply('COOKIE_INVALID ' .. (i + 1) .. ' ' .. name .. ' is not a string')
    end
  end
  if doc.value ~= nil and doc.value ~= cjson.null and type(doc.value) ~= 'string' then
    return redis.error_reply('COOKIE_INVALID ' .. (i + 1) .. ' value is not a string')
  end
  if doc.expires ~= nil and doc.expires ~= cjson.null and type(doc.expires) ~= 'number' then
    return redis.error_reply('COOKIE_INVALID ' .. (i + 1) .. ' expires is not a number')
  end
  if field_of(doc) ~= field then
    return redis.error_reply('COOKIE_INVALID ' .. i .. ' field does not match the cookie')
  end
  sets[#sets + 1] = field
  sets[#sets + 1] = text
end
local dels = {}
for i = 2 * n + 2, #ARGV do
  local bad = check_field(i, ARGV[i])
  if bad then return redis.error_reply(bad) end
  dels[#dels + 1] = ARGV[i]
end

local control_err = key_type_error(KEYS[2], 'hash', CONTROL_WHAT)
if control_err then return control_err end

if #sets > 0 then redis.call('HSET', KEYS[1], unpack(sets)) end
if #dels > 0 then redis.call('HDEL', KEYS[1], unpack(dels)) end

-- prune: cookies whose expiry (epoch seconds) is past, by Redis time
local time = redis.call('TIME')
local now_s = tonumber(time[1]) + tonumber(time[2]) / 1e6
local all = redis.call('HGETALL', KEYS[1])
local expired = {}
for i = 1, #all, 2 do
  if all[i] ~= VERSION then
    local ok, doc = pcall(cjson.decode, all[i + 1])
    if not ok or type(doc) ~= 'table' then
      expired[#expired + 1] = all[i]  -- unreadable: written by no version of this script
    elseif type(doc.expires) == 'number' and doc.expires <= now_s then
      expired[#expired + 1] = all[i]
    end
  end
end
for i = 1, #expired, 500 do
  redis.call('HDEL', KEYS[1], unpack(expired, i, math.min(i + 499, #expired)))
end
local version = redis.call('HINCRBY', KEYS[1], VERSION, 1)
redis.call('HSET', KEYS[2], 'cookies', time[1] .. string.format('%06d', tonumber(time[2]))
  .. ':' .. version)
return {version, #expired}
