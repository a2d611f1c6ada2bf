--[[ raise_fence: fence:{name} = max(current, token); record it in the lease's lock value (R4, R16).
  KEYS[1] fence:{name}  KEYS[2] lock:{name}  ARGV[1] token
  ARGV[2] lease_id ('' raises the counter alone: a node that ran ahead evens the rest)
  Returns the counter after the raise, or 0 when another lease holds the lock here.
  Round 2 of an acquire whose granting nodes returned different counters. A node
  that another lease holds is raised but not counted: that lease's grant here is
  older than the raise, so if it later completes a quorum with this node, its token
  could be lower than the raised one. Counting only nodes that are free or held by
  the raising lease means every later grant on a counted node comes after the raise. ]]
local token = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < token then
  redis.call('SET', KEYS[1], ARGV[1])
  current = token
end
local held = redis.call('GET', KEYS[2])
if held then
  if string.sub(held, 1, #ARGV[2] + 1) ~= ARGV[2] .. ':' then
    return 0
  end
  redis.call('SET', KEYS[2], ARGV[2] .. ':' .. ARGV[1], 'KEEPTTL')
end
return current
