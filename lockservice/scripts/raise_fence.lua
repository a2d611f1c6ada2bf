--[[ raise_fence: fence:{name} = max(current, token); record it in the lease's lock value.
  KEYS[1] fence:{name}  KEYS[2] lock:{name}  ARGV[1] token
  ARGV[2] lease_id ('' raises the counter alone: a node that ran ahead evens the rest)
  Returns the counter after the raise.
  Round 2 of an acquire whose granting nodes returned different counters. ]]
local token = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < token then
  redis.call('SET', KEYS[1], ARGV[1])
  current = token
end
local held = redis.call('GET', KEYS[2])
if held and string.sub(held, 1, #ARGV[2] + 1) == ARGV[2] .. ':' then
  redis.call('SET', KEYS[2], ARGV[2] .. ':' .. ARGV[1], 'KEEPTTL')
end
return current
