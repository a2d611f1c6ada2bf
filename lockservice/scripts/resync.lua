--[[ resync: raise many counters on a node that lost its data (a batch of a resync, R18).
  KEYS[1..n] fence:{name} keys  ARGV[1..n] the highest counter seen on the other nodes
  Returns the number of counters raised. ]]
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
