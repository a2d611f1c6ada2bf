--[[ raise_fence: fence:{name} = max(current, token); record it in the lease's lock value (R4, R16).
  KEYS[1] fence:{name}  KEYS[2] lock:{name}  KEYS[3] holders:{name}  KEYS[4] holdert:{name}
  ARGV[1] token
  ARGV[2] lease_id ('' raises the counter alone: a node that ran ahead evens the rest)
  Returns the counter after the raise, or 0 when another lease holds the lock here.
  Round 2 of an acquire whose granting nodes returned different counters. A node
  that another lease holds is raised but not counted: that lease's grant here is
  older than the raise, so if it later completes a quorum with this node, its token
  could be lower than the raised one. Counting only nodes that are free or held by
  the raising lease means every later grant on a counted node comes after the raise.
  A group of shared or semaphore holders counts when the raising lease is one of
  them and its grant has not expired (R22): the other members' grants are
  concurrent with it, not earlier. ]]
local token = tonumber(ARGV[1])
local id = ARGV[2]
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < token then
  redis.call('SET', KEYS[1], ARGV[1])
  current = token
end
local held = redis.call('GET', KEYS[2])
if held then
  if string.sub(held, 1, 1) == '=' then
    local entry = id ~= '' and redis.call('HGET', KEYS[4], id)
    local expiry = entry and redis.call('ZSCORE', KEYS[3], id)
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if not expiry or tonumber(expiry) <= now then
      return 0  -- not a member, or one whose lease expired (queue.lua: purge_members)
    end
    local tag = string.match(entry, '^%d+ ?(.*)$')
    redis.call('HSET', KEYS[4], id, ARGV[1] .. ' ' .. tag)
    return current
  end
  if string.sub(held, 1, #id + 1) ~= id .. ':' then
    return 0
  end
  redis.call('SET', KEYS[2], id .. ':' .. ARGV[1], 'KEEPTTL')
  local entry = redis.call('HGET', KEYS[4], id)
  if entry then
    redis.call('HSET', KEYS[4], id, ARGV[1] .. ' ' .. string.match(entry, '^%d+ ?(.*)$'))
  end
end
return current
