--[[ mark_synced: finish a resync: record the token base, then quarantine the node.
  KEYS[1] fencegate:synced  KEYS[2] fencegate:quarantine
  ARGV[1] token base  ARGV[2] quarantine (ms, 0 for none)
  Returns 1. The quarantine keeps the node out of every process's quorums until
  every lease it may have forgotten has expired. ]]
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
if tonumber(ARGV[2]) > 0 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
end
return 1
