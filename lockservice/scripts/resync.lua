--[[ resync: raise integer keys to at least the values given (fence:* counters of a resync, R18; fencegate:max_ttl_ms, R19).
  KEYS[1..n] integer keys  ARGV[1..n] the value each must at least have
  Returns the number of keys raised. ]]
local raised = 0
for i, key in ipairs(KEYS) do
  local want = tonumber(ARGV[i])
  local current = tonumber(redis.call('GET', key) or '0')
  if current < want then
    redis.call('SET', key, ARGV[i])
    raised = raised + 1
  end
end
return raised
