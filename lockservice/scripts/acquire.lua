--[[ acquire: take lock:{name} for lease_id and issue the next token.
  KEYS[1] lock:{name}   KEYS[2] fence:{name}   KEYS[3] fencegate:synced
  KEYS[4] fencegate:quarantine   KEYS[5] waitq:{name}   KEYS[6] waitx:{name}
  ARGV[1] lease_id   ARGV[2] ttl (ms)
  ARGV[3] ticket: '' for a try without waiting, else the waiter's arrival time
          (the same number on every node, so every node orders waiters alike)
  ARGV[4] keepalive (ms): a queued waiter that does not try again within it is dropped
  Returns {token, 0} when granted (token > 0),
          {0, pttl}  when another lease holds it or an earlier waiter is queued
                     (pttl: the holder's remaining ms, 0 when only queued behind),
          {-1, pttl} when this node is quarantined after a restart,
          {-2, 0}    when this node has not been synced (restarted, data lost, or new).
  The lock value is "<lease_id>:<token>" so that the holder's token can be read back.
  fencegate:synced holds the node's token base: a counter that is missing (first
  grant of a name, or lost with the node's data) starts above it, so tokens stay
  increasing even when every node lost its data. fence:* keys are never deleted.
  waitq:{name} (score: ticket) and waitx:{name} (score: expiry) queue the waiters:
  a free lock goes to the earliest live waiter, so the releasing client cannot
  take it straight back while others wait. ]]
local base = redis.call('GET', KEYS[3])
if not base then
  return {-2, 0}
end
local q = redis.call('PTTL', KEYS[4])
if q > 0 then
  return {-1, q}
end
local id = ARGV[1]

local function enqueue(now)
  if ARGV[3] ~= '' then
    redis.call('ZADD', KEYS[5], 'NX', ARGV[3], id)
    redis.call('ZADD', KEYS[6], now + tonumber(ARGV[4]), id)
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
  local head = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
  if head and head ~= id then
    enqueue(now)
    return {0, 0}
  end
  redis.call('ZREM', KEYS[5], id)
  redis.call('ZREM', KEYS[6], id)
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
