#!lua
-- claim: take up to N requests from ready lanes and lease each one to this worker, in
-- one atomic step. A lane is ready when its time in `lanes` has come and its rate
-- budget allows a claim now: claims are paced at the budget's rate on their own GCRA
-- clock (lib_rate.lua: ctat); the budget itself is taken by the downloader middleware
-- when the request starts. Lanes are served round-robin, one request at a time;
-- within a lane, highest priority first, in the order of each tier (lib_settle.lua). A
-- served lane moves behind the lanes not yet served (its time becomes now, or the time
-- its budget lets the next claim through).
-- Tiers: a lane's requests other than regular ones of priority 0 are in one LIST per
-- tier (lib_settle.lua), and a script only touches the keys it is given, so the caller
-- passes, per lane, the LIST of the tier it believes is the lane's top one (the
-- highest-ranked in the lane's tier index; learnt from earlier replies, or none). When
-- the lane's top tier ranks above priority 0 (or priority 0 has nothing) and is not the
-- one passed, the lane is not served by this call (it stays ready) and counts in
-- `stale`; the reply names every lane's top tier that differs from the one passed
-- (after a pop emptied a tier too), so that the next call passes the right one.
-- KEYS[1] lanes     ZSET  lane -> time from which it may be served (ms)
-- KEYS[2] leases    ZSET  claim token -> lease deadline (ms, Redis TIME)
-- KEYS[3] inflight  HASH  claim token -> envelope
-- KEYS[4] tokens    STRING  the last claim token issued (fencing tokens, lib_guard.lua)
-- KEYS[5] done      BITMAP  rid -> processed
-- KEYS[6] stats     HASH  crawl counters
-- KEYS[7] dead      HASH  rid -> dead letter (JSON)
-- KEYS[8] workers   ZSET  worker id -> last heartbeat (ms)
-- KEYS[9] todo      STRING  number of queued requests (never below 0, even when
--                  members were added to a queue by hand)
-- KEYS[10] owners   HASH  claim token -> worker id holding it (set with each lease)
-- KEYS[11] control  HASH  the fleet's control state (keys.py: state running|paused|
--                  stopping): anything but running claims nothing and reports the state;
--                  'started': the crawl's first claim (ms), set here
-- KEYS[12] fleet_stats HASH the fleet's Scrapy stats (fleet/stats.py), for the limits
-- KEYS[13] feed     LIST  JSON requests pushed by producers, not drained yet
-- KEYS[14] feed_taken HASH worker id -> feed entries taken, not queued yet (feed_take.lua)
-- KEYS[11 + 4i], KEYS[12 + 4i], KEYS[13 + 4i], KEYS[14 + 4i]: candidate lane i's tier
--                  index ZSET, priority-0 LIST, rate HASH, and the LIST of the tier
--                  named in its ARGV (any key of the crawl when none is named)
-- ARGV[1] max number of requests to claim (may be 0: only report)
-- ARGV[2] lease length in ms  ARGV[3] worker id  ARGV[4] number of candidate lanes
-- ARGV[5] slowdown half-life ms  ARGV[6] how many ready lanes to report
-- ARGV[7..10] the fleet-wide limits (LEASED_CLOSE_*; 0 = none): requests done (stats
--          'done'), items scraped and spider errors (fleet_stats 'item_scraped_count',
--          'spider_exceptions/count'), ms since the crawl's first claim. One reached,
--          the claim sets the control state to stopping (reason: the limit) and claims
--          nothing. With a page limit, a claim takes at most limit - done - leases: the
--          requests done and in flight never add up to more than the limit.
-- ARGV[11] 1 when this call continues one that claimed requests for the same caller
--          (Frontier.claim, after a stale lane): no request whose lease expired before is
--          claimed (those go alone), else 0
-- ARGV[8 + 4i..11 + 4i] per candidate lane: name, interval ms (0 = no budget), burst,
--          the code of the tier whose LIST is passed ('' none: the lane has no tier but
--          p0 as far as the caller knows)
-- Then the guard's four KEYS and four ARGV (lib_guard.lua: epoch, tokens, rids, this
-- worker's claim call key; call id, epoch, token, rid seen).
-- Returns {epoch, tokens, rids (lib_guard.lua), now_ms, todo, leases, next_ms, state, feed,
-- stale, cookies, n, lane1..lane_n, m, free1..free_m, k, lane1, tier1, ..., lane_k, tier_k,
-- token1, envelope1, ...} (only the first three for a replay-only call that finds no
-- reply): state is the control state (running, paused, stopping; when not running: no
-- claims, no lanes, next_ms = now_ms, feed 0); feed the entries in the feed and in
-- batches taken off it (LLEN feed + HLEN feed_taken: work that is not in the queues
-- yet, so the crawl is not finished); stale the number of lanes left unserved because
-- their top tier was not the one passed (claim again at once: the reply names it);
-- cookies the control HASH's 'cookies' field ('' when absent), changed by every write to
-- a cookie jar of the crawl (worker/lua/cookies_set.lua): a worker whose jars were read
-- at this value need not read them again for the requests of this claim;
-- lane1..n are ready lanes to pass as candidates next time, next_ms the earliest time
-- any lane is ready (now when one is); free1..m are the lanes claimed from that had
-- nothing to enforce at this moment (no budget, no Crawl-delay, no block), so their
-- requests may start without another check (LEASED_RATE_FREE_GRACE); (lane, tier) the
-- top tier, as this call last saw it, of each lane whose top tier is not the one passed
-- ('' when it has none left but p0).
-- A call sent again with its call id (lib_guard.lua) gets its claims back, rebuilt from
-- the record of the tokens it issued (the replay below), the rest as it is now.
-- Requests whose rid is already marked done (a stale copy requeued after its first
-- worker acked late) are dropped here and counted in stats 'skipped_done'.
-- A request whose lease expired before (expiries > 0: its worker died holding it) is
-- claimed only alone, as the first and only request of a call (not by a call that
-- continues another, ARGV[11]), so that a request that
-- crashes its worker does not take other claims down with it. When it comes up after
-- other claims of a call, it goes back to the head of its tier and its lane is served
-- first by the next call (its time becomes 0), so it cannot starve behind other lanes.
-- A queue member that is not valid UTF-8 is dead-lettered (invalid bytes shown as '?').
-- The feed's count first (the call changes neither key), read so that a feed key of the
-- wrong type (a producer's XADD or SET) cannot fail the call after its writes: the
-- queued work is claimed as usual and the feed is reported as holding 1 entry, so the
-- worker goes to drain it, where feed_take.lua refuses before any write with the key and
-- its type (lib_keys.lua); the worker moves the key aside (key_aside.lua, logged as an
-- ERROR), and the feed works again.
local feed = redis.pcall('LLEN', KEYS[13])
local feed_taken = redis.pcall('HLEN', KEYS[14])
if type(feed) ~= 'number' or type(feed_taken) ~= 'number' then
  feed = 1
else
  feed = feed + feed_taken
end
-- The two numbers used after the pops (the leases' deadline, how many ready lanes to
-- report), checked before any write too: a nan or a non-number there (the worker sends
-- ints) would stop the script after its leases were written. (x - x ~= 0: nan or inf.)
-- Any other argument that is not a number fails or claims nothing before the pops.
local lease_ms, n_ready = tonumber(ARGV[2]), tonumber(ARGV[6])
if not lease_ms or not n_ready or lease_ms - lease_ms ~= 0 or n_ready - n_ready ~= 0 then
  return redis.error_reply('claim: the lease ms and the number of lanes to report must be '
    .. 'finite numbers, not ' .. tostring(ARGV[2]) .. ', ' .. tostring(ARGV[6]))
end
-- the control state is read after the first writes: its type is checked before them (a
-- SET by hand; the worker moves it aside: key_aside.lua)
local control_err = key_type_error(KEYS[11], 'hash', CONTROL_WHAT)
if control_err then return control_err end
local g = guard_open()
if g.replay_only and not g.replayed then return guard_reply(g, {}) end
local keys = {lanes = KEYS[1], stats = KEYS[6], dead = KEYS[7], todo = KEYS[9]}
local want = tonumber(ARGV[1])
local continues = ARGV[11] == '1'
local LIMIT_STAT = {[7] = {KEYS[6], 'done', 'LEASED_CLOSE_PAGECOUNT'},
  [8] = {KEYS[12], 'item_scraped_count', 'LEASED_CLOSE_ITEMCOUNT'},
  [9] = {KEYS[12], 'spider_exceptions/count', 'LEASED_CLOSE_ERRORCOUNT'}}
local half_life = tonumber(ARGV[5])
g.now_us = guard_now_us()  -- one TIME read for the call: its tokens and its ms
local now = math.floor(g.now_us / 1000)
local now_arg = num_arg(now)

-- The reply when the control state is not running: nothing claimed, no lanes.
local function idle_reply(state, cookies)
  return {now, tonumber(redis.call('GET', KEYS[9]) or 0), redis.call('ZCARD', KEYS[2]), now,
    state, 0, 0, cookies, 0, 0, 0}
end

-- The reply of a call that claimed (see the header): the counts, the ready lanes and
-- the earliest time a lane is ready, as they are now, then what the call decided.
local function claim_reply(todo, state, stale, cookies, free, tiers, claims)
  local ready = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_arg, 'LIMIT', '0',
    num_arg(n_ready))
  local next_ms = now
  if #ready == 0 then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    next_ms = first[2] and tonumber(first[2]) or -1
  end
  local out = {now, todo, redis.call('ZCARD', KEYS[2]),
    next_ms, state, feed, stale, cookies, #ready}
  for _, lane in ipairs(ready) do out[#out + 1] = lane end
  out[#out + 1] = #free
  for _, lane in ipairs(free) do out[#out + 1] = lane end
  out[#out + 1] = #tiers / 2
  for _, v in ipairs(tiers) do out[#out + 1] = v end
  for _, v in ipairs(claims) do out[#out + 1] = v end
  return out
end

-- A call sent again (its reply was lost): the record is {control state, token...}, and
-- the reply is rebuilt from it: the claims whose lease is still held (their envelopes
-- in inflight; a lease lost meanwhile was recovered, its request queued again), the
-- counts and ready lanes as they are now, no free lanes (their requests are checked at
-- download time), no stale lane and no tiers (the next call learns them). Recording
-- the tokens only, not the reply, saves the reply's packing in every call.
if g.replayed then
  local state = g.replayed[1]
  local cookies = redis.call('HGET', KEYS[11], 'cookies') or ''
  if state ~= 'running' then return guard_reply(g, idle_reply(state, cookies)) end
  local tokens = {unpack(g.replayed, 2)}
  local envs = batch_call('HMGET', KEYS[3], tokens, nil, true)
  local claims = {}
  for i, token in ipairs(tokens) do
    if envs[i] then
      claims[#claims + 1] = token
      claims[#claims + 1] = envs[i]
    end
  end
  return guard_reply(g, claim_reply(tonumber(redis.call('GET', KEYS[9]) or 0), state, 0,
    cookies, {}, {}, claims))
end

redis.call('ZADD', KEYS[8], now_arg, ARGV[3])
local control = redis.call('HMGET', KEYS[11], 'state', 'started', 'cookies')
local state = control[1] or 'running'
local started = tonumber(control[2])
local cookies = control[3] or ''
if not started then
  started = now
  redis.call('HSET', KEYS[11], 'started', now)
end
if state == 'running' then  -- the fleet-wide limits
  local reached = nil
  for i = 7, 9 do
    local limit = tonumber(ARGV[i])
    if limit > 0 then
      local s = LIMIT_STAT[i]
      local raw = redis.call('HGET', s[1], s[2]) or '0'
      local count = tonumber(raw) or 0
      if count >= limit then
        reached = s[3] .. ' (' .. ARGV[i] .. ') reached: ' .. s[2] .. ' ' .. raw
        break
      end
      if i == 7 then
        want = math.min(want, limit - count - redis.call('ZCARD', KEYS[2]))
      end
    end
  end
  local timeout = tonumber(ARGV[10])
  if not reached and timeout > 0 and now - started >= timeout then
    reached = 'LEASED_CLOSE_TIMEOUT reached: ' .. ARGV[10] .. ' ms since the first claim'
  end
  if reached then
    state = 'stopping'
    redis.call('HSET', KEYS[11], 'state', state, 'since', now, 'by', ARGV[3], 'reason', reached)
  end
end
if state ~= 'running' then
  return guard_reply(g, idle_reply(state, cookies), {state})
end
-- The candidate lanes, each looked at when the round robin below first reaches it (a
-- claim that is served by the first lanes reads nothing of the others): it is served
-- when its time in `lanes` has come and its budget lets a claim through; a lane whose
-- budget does not moves to the time it will (and is not served by this call).
local active = {}
for i = 1, tonumber(ARGV[4]) do active[i] = {i = i} end
local all_active = {}  -- the candidates looked at and served, in their order
local function claimable(l)
  if l.lane then return true end
  local i = l.i
  local lane, a = ARGV[8 + 4 * i], 8 + 4 * i
  local score = redis.call('ZSCORE', KEYS[1], lane)
  if not score or tonumber(score) > now then return false end
  local rate = KEYS[13 + 4 * i]
  local avail, interval, ready = rate_claimable(rate, tonumber(ARGV[a + 1]),
    tonumber(ARGV[a + 2]), now, half_life)
  if not (avail > 0) then  -- (a nan budget claims nothing too)
    redis.call('ZADD', KEYS[1], 'XX', ready, lane)
    return false
  end
  l.lane, l.idx, l.p0, l.tier = lane, KEYS[11 + 4 * i], KEYS[12 + 4 * i], KEYS[14 + 4 * i]
  l.code, l.top, l.rate, l.avail = ARGV[a + 3], ARGV[a + 3], rate, avail
  l.interval, l.burst, l.took = interval, tonumber(ARGV[a + 2]), 0
  all_active[#all_active + 1] = l
  return true
end
-- Take the head of a lane's queue: its top tier's, where the top tier is the highest
-- ranked of the tier index (l.top records it), or priority 0's LIST when that ranks
-- first (or the index is empty). Returns the envelope, the LIST it came from and
-- whether that is a tier's; nil when the lane has nothing left, or when its top tier
-- is not the one passed (l.stale). The head of a lane's tier index is read once per
-- call (heads: index key -> its ZRANGE reply), again only after this call changed the
-- index (a ZREM); nothing else changes it while the script runs.
local heads = {}
local function queue_pop(l)
  while true do  -- twice at most: a tier listed without a LIST (by hand) is dropped
    local head = heads[l.idx]
    if not head then
      head = redis.call('ZRANGE', l.idx, 0, 0, 'WITHSCORES')
      heads[l.idx] = head
    end
    l.top = head[1] or ''
    if not head[1] or tonumber(head[2]) >= 0 then
      local env = redis.call('LPOP', l.p0)
      if env then return env, l.p0 end
      if not head[1] then return nil end
    end
    if head[1] ~= l.code then
      l.stale = true
      return nil
    end
    local env = redis.call('LPOP', l.tier)
    if env then return env, l.tier, true end
    redis.call('ZREM', l.idx, head[1])
    heads[l.idx] = nil
  end
end

-- The loop pops and decides; what it decides is written once per call after it: the
-- leases (one variadic ZADD, HSET inflight, HSET owners, after the tokens key), todo,
-- the lanes' times (one ZADD, one ZREM) and the counters. Nothing in the loop reads
-- those keys (a dead-lettered member is parked, not requeued).
local claims = {}
local leases, owners = {}, {}  -- and claims: {token, envelope, ...} is inflight's HSET
local deadline = num_arg(now + lease_ms)
local got, stop = 0, false
local popped, put_back_n, skipped = 0, 0, 0
-- lane -> its first candidate entry popped from, whose `left` is what the lane's
-- latest pop left ('now', 'zero' or 'gone': a lane may be named twice)
local popped_from = {}
local function touch(l, left)
  local first = popped_from[l.lane]
  if not first then
    first = l
    popped_from[l.lane] = l
  end
  first.left = left
end
-- lane -> the candidate entry whose latest pop took the head of a tier's LIST, not
-- checked for emptiness yet. A tier's LIST emptied leaves the index (and l.top becomes
-- the next tier): checked once, after the loop, or before another entry naming the
-- same lane pops from it (its queue_pop must see the index as it is). The same entry
-- popping again needs no check: its queue_pop drops a tier listed without a LIST.
-- Returns true when the tier's LIST still exists (the lane is not empty).
local unchecked = {}
local function check_tier(l)
  unchecked[l.lane] = nil
  if redis.call('EXISTS', l.tier) == 1 then return true end
  redis.call('ZREM', l.idx, l.code)
  heads[l.idx] = nil
  l.top = redis.call('ZRANGE', l.idx, 0, 0)[1] or ''
  return false
end
while got < want and #active > 0 and not stop do
  local still = {}
  for _, l in ipairs(active) do
    if got >= want or stop then break end
    if claimable(l) then
      local pending = unchecked[l.lane]
      if pending and pending ~= l then check_tier(pending) end
      local env, from, tiered = queue_pop(l)
      if tiered then
        unchecked[l.lane] = l
      elseif pending == l then  -- its queue_pop read the index again: nothing to check
        unchecked[l.lane] = nil
      end
      if env then
        popped = popped + 1
        touch(l, 'now')  -- unless its queue is empty now: checked after the loop
        local rid, _, expiries = envelope_head(env)
        if not rid then
          settle_failure(keys, nil, env, 'queue member is not an envelope', 1, true, now, 0)
        elseif not utf8_valid(env) then
          settle_failure(keys, nil, utf8_clean(env), 'queue member is not valid UTF-8', 1,
            true, now, 0)
        elseif tonumber(rid) <= MAX_BITMAP_RID and redis.call('GETBIT', KEYS[5], rid) == 1 then
          skipped = skipped + 1
        elseif expiries ~= '0' and (got > 0 or continues) then
          redis.call('LPUSH', from, env)  -- a suspect goes alone: next call, its lane first
          put_back_n = 1
          stop = true
          l.suspect = true
          touch(l, 'zero')
        else
          local token = int_str(guard_token(g))
          leases[#leases + 1] = deadline
          leases[#leases + 1] = token
          owners[#owners + 1] = token
          owners[#owners + 1] = ARGV[3]
          claims[#claims + 1] = token
          claims[#claims + 1] = env
          got = got + 1
          l.avail = l.avail - 1
          l.took = l.took + 1
          if expiries ~= '0' then stop = true end
        end
        if not l.suspect and l.avail > 0 then still[#still + 1] = l end
      elseif not l.stale then
        touch(l, 'gone')  -- nothing left: the lane leaves `lanes`
      end  -- stale: its top tier is not the one passed; the lane stays as it is
    end
  end
  active = still
end
guard_flush(g)  -- the tokens key first: never below a token held in leases
batch_call('ZADD', KEYS[2], leases)
batch_call('HSET', KEYS[3], claims)
batch_call('HSET', KEYS[10], owners)
-- todo, as if decremented at each pop (never below 0) and raised by a suspect put back
-- (popped >= put_back_n: the suspect put back was popped too)
local todo
if popped > 0 then
  todo = redis.call('DECRBY', KEYS[9], int_str(popped - put_back_n))
  if todo < put_back_n then  -- it counted fewer than were popped (queued by hand)
    todo = put_back_n
    redis.call('SET', KEYS[9], todo)
  end
else
  todo = tonumber(redis.call('GET', KEYS[9]) or 0)
end
-- The tiers whose LIST the lanes' latest pops took from: emptied, they leave the index.
local live = {}  -- lane -> its latest pop's tier LIST still exists
for lane, l in pairs(unchecked) do
  live[lane] = check_tier(l)
end
-- The lanes popped from, as their latest pop left them: out of `lanes` when empty,
-- else behind the lanes not served yet (now), or first for the next call when a suspect
-- went back (0); then at the time their budget lets the next claim through, if later.
local gone = {}
for lane, l in pairs(popped_from) do
  if l.left == 'gone' or (l.left == 'now' and not live[lane]
      and redis.call('EXISTS', l.idx, l.p0) == 0) then
    gone[#gone + 1] = lane
    popped_from[lane] = nil
  else
    l.at = l.left == 'zero' and 0 or now
  end
end
local free = {}  -- lanes claimed from with nothing to enforce (interval 0)
for _, l in ipairs(all_active) do
  if l.took > 0 and l.interval > 0 then
    local next_claim = rate_claimed(l.rate, l.took, l.interval, l.burst, now)
    local first = popped_from[l.lane]
    if next_claim > now and first then first.at = next_claim end
  elseif l.took > 0 then
    free[#free + 1] = l.lane
  end
end
local times = {}
for lane, l in pairs(popped_from) do
  times[#times + 1] = num_arg(l.at)
  times[#times + 1] = lane
end
batch_call('ZREM', KEYS[1], gone)
batch_call('ZADD', KEYS[1], times, 'XX')
if got > 0 then redis.call('HINCRBY', KEYS[6], 'claimed', int_str(got)) end
if skipped > 0 then redis.call('HINCRBY', KEYS[6], 'skipped_done', int_str(skipped)) end
local stale, tiers = 0, {}
for _, l in ipairs(all_active) do
  if l.stale then stale = stale + 1 end
  if l.top ~= l.code then
    tiers[#tiers + 1] = l.lane
    tiers[#tiers + 1] = l.top
  end
end
local record = {state}  -- and the tokens issued: see the replay above
for i = 1, #claims, 2 do record[#record + 1] = claims[i] end
return guard_reply(g, claim_reply(todo, state, stale, cookies, free, tiers, claims), record)
