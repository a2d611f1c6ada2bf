--[[ recopied: the second copy of a resync is done (R21): the node may grant again.
  KEYS[1] fencegate:synced  KEYS[2] fencegate:quarantine
  ARGV[1] the node's run_id as the copier read it
  Returns 1 when cleared, 0 when the node is no longer in that run (restarted since:
  its new run has its own resync, whose flag must stay). ]]
local marker = redis.call('GET', KEYS[1])
if not marker or string.sub(marker, -#ARGV[1] - 1) ~= ' ' .. ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2] .. ':recopy')
return 1
