--[[ inspect: the state of one lock, for status and the forged-token guard (R17).
  KEYS[1] lock:{name}  KEYS[2] fence:{name}  KEYS[3] fencegate:synced
  ARGV[1] the node's run_id as the caller read it when it connected
  Returns {holder token or 0, pttl or 0, counter or 0}; never the lease_id.
  Returns {-2} on a node that has not been synced in this run: its counters may
  be behind. ]]
local marker = redis.call('GET', KEYS[3])
if not marker or string.sub(marker, -#ARGV[1] - 1) ~= ' ' .. ARGV[1] then
  return {-2}
end
local held = redis.call('GET', KEYS[1])
local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
if not held then
  return {0, 0, counter}
end
local sep = string.find(held, ':', 1, true)
return {tonumber(string.sub(held, sep + 1)), redis.call('PTTL', KEYS[1]), counter}
