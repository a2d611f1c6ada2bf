--[[ acquire: take lock:{name} for lease_id and issue the next token.
  KEYS[1] lock:{name}  KEYS[2] fence:{name}  KEYS[3] fencegate:synced  KEYS[4] fencegate:quarantine
  ARGV[1] lease_id  ARGV[2] ttl (ms)
  Returns {token, 0} when granted (token > 0),
          {0, pttl}  when another lease holds it (pttl: its remaining ms),
          {-1, pttl} when this node is quarantined after a restart,
          {-2, 0}    when this node has not been synced (restarted, data lost, or new).
  The lock value is "<lease_id>:<token>" so that the holder's token can be read back.
  fencegate:synced holds the node's token base: a counter that is missing (first
  grant of a name, or lost with the node's data) starts above it, so tokens stay
  increasing even when every node lost its data. fence:* keys are never deleted. ]]
local base = redis.call('GET', KEYS[3])
if not base then
  return {-2, 0}
end
local q = redis.call('PTTL', KEYS[4])
if q > 0 then
  return {-1, q}
end
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #ARGV[1] + 1) ~= ARGV[1] .. ':' then
  return {0, redis.call('PTTL', KEYS[1])}
end
local token = redis.call('INCR', KEYS[2])
base = tonumber(base)
if token <= base then
  token = base + 1
  redis.call('SET', KEYS[2], string.format('%d', token))
end
-- '%d', never tostring: Lua 5.1 prints numbers with 14 significant digits
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. string.format('%d', token), 'PX', ARGV[2])
return {token, 0}
