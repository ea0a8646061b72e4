-- Shared helper, prepended by Python to every script that needs the time: Redis
-- server time in ms (never a worker's clock). Not a script on its own.
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
