--[[ inspect: the state of one lock, for status and the forged-token guard (R17).
  KEYS[1] lock:{name}  KEYS[2] fence:{name}  KEYS[3] fencegate:synced
  KEYS[4] holders:{name}  KEYS[5] holdert:{name}
  ARGV[1] the node's run_id as the caller read it when it connected
  Returns {holder token or 0, pttl or 0, counter or 0, holders, kind, permits};
  never a lease_id. For a group of shared or semaphore holders (R22) the token is
  the newest of their tokens and pttl the time until the last one ends; kind is
  0 free, 1 exclusive, 2 shared, 3 semaphore.
  Returns {-2} on a node that has not been synced in this run: its counters may
  be behind. ]]
local marker = redis.call('GET', KEYS[3])
if not marker or string.sub(marker, -#ARGV[1] - 1) ~= ' ' .. ARGV[1] then
  return {-2}
end
local held = redis.call('GET', KEYS[1])
local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
if not held then
  return {0, 0, counter, 0, 0, 0}
end
if string.sub(held, 1, 1) ~= '=' then
  local sep = string.find(held, ':', 1, true)
  return {tonumber(string.sub(held, sep + 1)), redis.call('PTTL', KEYS[1]), counter, 1, 1, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mode, permits = string.match(held, '^=(%a+) (%d+)$')
local live = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. now, '+inf', 'WITHSCORES')
if #live == 0 then
  return {0, 0, counter, 0, 0, 0}
end
local token, last = 0, 0
for i = 1, #live, 2 do
  local entry = redis.call('HGET', KEYS[5], live[i])
  local value = tonumber(entry and string.match(entry, '^(%d+)') or '0')
  if value > token then
    token = value
  end
  last = math.max(last, tonumber(live[i + 1]))
end
local kind = 2
if mode == 'semaphore' then
  kind = 3
end
return {token, last - now, counter, #live / 2, kind, tonumber(permits)}
