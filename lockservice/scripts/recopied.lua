--[[ recopied: the second copy of a resync is done (R21): the node may grant again.
  KEYS[1] fencegate:synced  KEYS[2] fencegate:quarantine
  ARGV[1] the node's run_id as the copier read it
  ARGV[2] a token base (optional, 0 for none): the marker's base is raised to it
  (R18's fallback, when too few nodes are synced for the second copy)
  Returns 1 when cleared, 0 when the node is no longer in that run (restarted since:
  its new run has its own resync, whose flag must stay). ]]
local marker = redis.call('GET', KEYS[1])
if not marker or string.sub(marker, -#ARGV[1] - 1) ~= ' ' .. ARGV[1] then
  return 0
end
local base = tonumber(ARGV[2] or '0') or 0
local old = tonumber(string.sub(marker, 1, (string.find(marker, ' ', 1, true) or 0) - 1))
if base > 0 and (not old or base > old) then
  redis.call('SET', KEYS[1], string.format('%d', base) .. ' ' .. ARGV[1])
end
redis.call('DEL', KEYS[2] .. ':recopy')
return 1
