--[[ extend: push back the expiry of lease_id's hold on lock:{name} (R6), alone or as a
  member of a group of shared or semaphore holders (R22).
  KEYS[1] lock:{name}  KEYS[2] holders:{name}  KEYS[3] holdert:{name}
  ARGV[1] lease_id  ARGV[2] ttl (ms)
  Returns the lease's token when extended (the decided one when its owner
  committed an idempotency tag, R26), or {token, 1} for a member of a semaphore
  group, so that the caller counts every node whatever kind it thinks the lease is
  (R32: a handle is labelled exclusive), 0 when the lock is absent or held by
  another lease. Never re-creates an expired lock: that would hand a lost lease
  back silently. ]]
local id, ttl = ARGV[1], tonumber(ARGV[2])
local current = redis.call('GET', KEYS[1])
if not current then
  return 0
end
if string.sub(current, 1, #id + 1) == id .. ':' then
  redis.call('PEXPIRE', KEYS[1], ttl)
  local committed = redis.call('HGET', KEYS[3], id)
  if committed then
    redis.call('PEXPIRE', KEYS[3], ttl)  -- its idempotency tag (R26)
    return tonumber(string.match(committed, '^(%d+)'))  -- the decided token
  end
  return tonumber(string.sub(current, #id + 2))
end
if string.sub(current, 1, 1) ~= '=' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = redis.call('ZSCORE', KEYS[2], id)
local entry = redis.call('HGET', KEYS[3], id)
if not expiry or tonumber(expiry) <= now or not entry then
  return 0
end
redis.call('ZADD', KEYS[2], now + ttl, id)
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2]
for _, key in ipairs(KEYS) do
  redis.call('PEXPIREAT', key, last)
end
local token = tonumber(string.match(entry, '^(%d+)'))
if string.match(current, '^=(%a+)') == 'semaphore' then
  return {token, 1}
end
return token
