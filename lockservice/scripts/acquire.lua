--[[ acquire: take lock:{name} for lease_id and issue the next token.
  KEYS[1] lock:{name}   KEYS[2] fence:{name}   KEYS[3] fencegate:synced
  KEYS[4] fencegate:quarantine   KEYS[5] waitq:{name}   KEYS[6] waitx:{name}
  ARGV[1] lease_id   ARGV[2] ttl (ms)
  ARGV[3] ticket: '' for a try without waiting, else the waiter's arrival time
          (the same number on every node, so every node orders waiters alike)
  ARGV[4] keepalive (ms): a queued waiter that does not try again within it is dropped
  ARGV[5] the node's run_id as the caller read it when it connected
  ARGV[6] the caller's process id: queue members are "<lease_id>@<process>", so a
          release can wake the next waiter's process alone
  Returns {token, 0} when granted (token > 0),
          {0, pttl}  when another lease holds it or an earlier waiter is queued
                     (pttl: the holder's remaining ms, 0 when only queued behind),
          {-1, pttl} when this node is quarantined after a restart,
          {-2, 0}    when this node has not been synced in this run (restarted, data
                     lost or reloaded from an old snapshot, or new).
  The lock value is "<lease_id>:<token>" so that the holder's token can be read back.
  fencegate:synced is "<token base> <run_id>": it counts only for the run of the
  server that was synced. A counter that is missing (first grant of a name, or
  lost with the node's data) starts above the base, so tokens stay increasing
  even when every node lost its data. fence:* keys are never deleted.
  waitq:{name} (score: ticket) and waitx:{name} (score: expiry) queue the waiters:
  a free lock goes to the earliest live waiter, so the releasing client cannot
  take it straight back while others wait. ]]
local marker = redis.call('GET', KEYS[3])
if not marker then
  return {-2, 0}
end
local sep = string.find(marker, ' ', 1, true)
if not sep or string.sub(marker, sep + 1) ~= ARGV[5] then
  return {-2, 0}
end
local base = string.sub(marker, 1, sep - 1)
local q = redis.call('PTTL', KEYS[4])
if q > 0 then
  return {-1, q}
end
local id = ARGV[1]
local member = id .. '@' .. ARGV[6]

local function enqueue(now)
  if ARGV[3] ~= '' then
    local keepalive = tonumber(ARGV[4])
    redis.call('ZADD', KEYS[5], 'NX', ARGV[3], member)
    redis.call('ZADD', KEYS[6], now + keepalive, member)
    -- queues of names nobody asks for again must not stay forever
    redis.call('PEXPIRE', KEYS[5], 2 * keepalive)
    redis.call('PEXPIRE', KEYS[6], 2 * keepalive)
  end
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #id + 1) ~= id .. ':' then
  if ARGV[3] ~= '' then
    enqueue(now_ms())
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
if redis.call('EXISTS', KEYS[6]) == 1 then
  local now = now_ms()
  local dead = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now, 'LIMIT', 0, 100)
  if #dead > 0 then
    redis.call('ZREM', KEYS[6], unpack(dead))
    redis.call('ZREM', KEYS[5], unpack(dead))
  end
  -- Join first (NX keeps an earlier place), then look: a waiter this node had not
  -- seen yet (it restarted, or missed an enqueue) takes its place by its ticket now,
  -- as on the other nodes, instead of waiting a retry behind later waiters.
  enqueue(now)
  local head = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
  if head and head ~= member then
    return {0, 0}
  end
  redis.call('ZREM', KEYS[5], member)
  redis.call('ZREM', KEYS[6], member)
end
local token = redis.call('INCR', KEYS[2])
base = tonumber(base)
if token <= base then
  token = base + 1
  redis.call('SET', KEYS[2], string.format('%d', token))
end
-- '%d', never tostring: Lua 5.1 prints numbers with 14 significant digits
redis.call('SET', KEYS[1], id .. ':' .. string.format('%d', token), 'PX', ARGV[2])
return {token, 0}
